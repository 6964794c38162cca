"""Drafters: propose up to γ next tokens and the distributions q they were drawn from.

The contract follows transformers' ``CandidateGenerator``: ``propose`` gets the full committed sequence
(drafters roll their own state back to it) and returns a :class:`Draft`. A tree drafter would return
several branches; the linear ``Draft`` is its single-branch case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cache import CachedModel
from .sampling import Sampler

StopRule = Callable[[torch.Tensor], bool]
"""Called with the draft's distribution for the next token; True stops drafting before that token."""


@dataclass
class Draft:
    """Proposed ids; ``q`` (γ, vocab) holds the distribution each was drawn from, None for a
    deterministic proposal (q is one-hot at the proposed id)."""

    ids: list[int]
    q: torch.Tensor | None
    drafter: str

    def q_of_ids(self) -> list[float]:
        if self.q is None:
            return [1.0] * len(self.ids)
        rows = torch.arange(len(self.ids), device=self.q.device)
        return self.q[rows, torch.tensor(self.ids, device=self.q.device)].tolist()


class Drafter:
    """Base class: a named source of draft tokens with a per-token cost the policies can learn."""

    name = "drafter"
    models: list[CachedModel] = []

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        raise NotImplementedError

    def prefill(self, tokens: list[int]) -> None:
        """Process the prompt ahead of the first step (nothing to do for model-free drafters)."""


class ModelDrafter(Drafter):
    """Drafts autoregressively with a small causal LM that shares the target's token ids."""

    def __init__(self, model: CachedModel):
        self.model = model
        self.models = [model]
        self.name = model.name

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        seq, qs = list(tokens), []
        for _ in range(gamma):
            logits = self.model.forward(seq, keep=1)[0]
            q = sampler.probs(logits)
            if stop is not None and stop(q):
                break
            seq.append(int(sampler.pick(logits, q)))
            qs.append(q)
        drafted = seq[len(tokens):]
        return Draft(drafted, torch.stack(qs) if qs else None, self.name)

    def prefill(self, tokens: list[int]) -> None:
        self.model.prefill(tokens)


class NGramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the current suffix (longest n first) and
    propose the tokens that followed it. Needs no model; q is one-hot."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        return Draft(lookup_continuation(tokens, gamma, self.max_ngram, self.min_ngram), None, self.name)


def lookup_continuation(tokens: list[int], gamma: int, max_ngram: int, min_ngram: int = 1) -> list[int]:
    """Continuation of the most recent earlier match of the longest matching suffix (≤ γ tokens)."""
    if gamma <= 0:
        return []
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + gamma]
    return []
