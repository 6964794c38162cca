"""Acceptance rules: decide how much of a draft the target keeps and which token it adds.

Every rule returns a :class:`Verdict`. The exact rule is lossless: greedy keeps drafts equal to the
target's argmax; sampling is Leviathan et al.'s rule with the residual ``norm(max(0, p − q))`` and a
bonus token drawn from ``p_{γ+1}`` when everything was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafters import Draft
from .sampling import Sampler

ACCEPTED, REJECTED, UNCHECKED = "exact", "rejected", "unchecked"


@dataclass
class Verdict:
    """``accepted`` drafts kept, then ``next_token`` from the target; one reason per drafted token."""

    accepted: int
    next_token: int
    reasons: list[str]
    judge_scores: list[float] | None = None


def reasons_for(accepted: int, drafted: int, kept_as: list[str] | None = None) -> list[str]:
    kept = kept_as or [ACCEPTED] * accepted
    tail = [REJECTED] + [UNCHECKED] * (drafted - accepted - 1) if accepted < drafted else []
    return kept + tail


def one_hot_rows(ids: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    q = torch.zeros(len(ids), vocab, device=device)
    q[torch.arange(len(ids)), torch.tensor(ids, device=device)] = 1.0
    return q


class ExactRule:
    """Standard (lossless) speculative verification."""

    name = "exact"

    def verify(self, draft: Draft, logits: torch.Tensor, p: torch.Tensor, sampler: Sampler) -> Verdict:
        gamma = len(draft.ids)
        ids = torch.tensor(draft.ids, dtype=torch.long, device=logits.device)
        if sampler.greedy:
            best = logits.argmax(-1)
            n = first_false(ids == best[:gamma])
            return Verdict(n, int(best[n]), reasons_for(n, gamma))
        q = draft.q.to(p.device) if draft.q is not None else one_hot_rows(draft.ids, p.shape[-1], p.device)
        n = first_false(leviathan_accepts(ids, p[:gamma], q, sampler))
        if n == gamma:
            return Verdict(n, int(sampler.draw(p[gamma])), reasons_for(n, gamma))
        return Verdict(n, int(sampler.draw(residual(p[n], q[n]))), reasons_for(n, gamma))


def leviathan_accepts(ids: torch.Tensor, p: torch.Tensor, q: torch.Tensor, sampler: Sampler,
                      lenience: float = 1.0) -> torch.Tensor:
    """Accept x_i with probability min(1, p_i(x_i) / (l · q_i(x_i))); l = 1 is the exact rule."""
    rows = torch.arange(len(ids), device=ids.device)
    px, qx = p[rows, ids], q[rows, ids]
    return sampler.uniform(len(ids), p.device) * qx * lenience < px


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)); p itself where p ≤ q everywhere (then p == q and no mass is left)."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p


def first_false(mask: torch.Tensor) -> int:
    """Length of the leading run of True."""
    misses = (~mask).nonzero()
    return int(misses[0]) if len(misses) else len(mask)
