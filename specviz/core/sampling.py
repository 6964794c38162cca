"""The one place where logits become probabilities and tokens are drawn."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampler:
    """Temperature / top-p transform and a seeded generator; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    device: str | torch.device | None = None  # None: torch's default device

    def __post_init__(self) -> None:
        self.generator = torch.Generator(device=self.device or torch.get_default_device())
        self.generator.manual_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Distribution after the sampling transform (plain softmax when greedy, used for display)."""
        logits = logits.float()
        if self.greedy:
            return logits.softmax(-1)
        probs = (logits / self.temperature).softmax(-1)
        return top_p_filter(probs, self.top_p) if self.top_p < 1 else probs

    def pick(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """One token per row: argmax of the logits when greedy (as transformers does), else a draw."""
        if self.greedy:
            return logits.argmax(-1)
        return self.draw(probs)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=self.generator).reshape(probs.shape[:-1])

    def uniform(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, device=self.generator.device).to(device)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise."""
    sorted_p, order = probs.sort(-1, descending=True)
    outside = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)); p itself where p ≤ q everywhere (then p == q and no mass is left)."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p
