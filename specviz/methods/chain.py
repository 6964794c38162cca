"""Polybasic speculative decoding: a chain of models where each level verifies the level below.

A :class:`StagedDrafter` is the paper's staged verification (Algorithm 1) written as a drafter: its
``inner`` drafter proposes up to K tokens, its ``verifier`` model checks them by the exact rule and
appends what it keeps (plus its own correction or bonus token) to a pending block, together with its
own distributions. The block goes up when it reaches μ tokens (the γ the engine asks for) or on a
rejection, and the level above verifies it using those distributions as q — so every level stays
exact. Longer chains nest: the inner drafter may itself be a StagedDrafter.

Each proposal reports, per level (top first), what that level did in ``Draft.levels``: passes
(forwards), milliseconds and, for verifying levels, (draft length, tokens passed up) per verification;
:mod:`specviz.analysis.theory` turns these into Lemma 3.1 / Theorems 3.2–3.3 numbers.
"""

from __future__ import annotations

import torch

from specviz.core.acceptance import ExactRule, Verdict
from specviz.core.cache import CachedModel
from specviz.core.drafters import Draft, Drafter, LevelRecord, StopRule
from specviz.core.sampling import Sampler

DEFAULT_LEVEL_GAMMA = 4


def merge_levels(total: list[LevelRecord], part: list[LevelRecord]) -> None:
    """Add one inner proposal's per-level records into the running totals (same chain, same order)."""
    for acc, rec in zip(total, part):
        acc.passes += rec.passes
        acc.ms += rec.ms
        acc.verifications += rec.verifications
        acc.blocks += rec.blocks


class StagedDrafter(Drafter):
    """``inner`` drafts K tokens at a time, ``verifier`` checks them and accumulates the block it hands up."""

    def __init__(self, inner: Drafter, verifier: CachedModel, level_gamma: int = DEFAULT_LEVEL_GAMMA):
        self.inner, self.verifier, self.level_gamma = inner, verifier, level_gamma
        self.models = [verifier, *inner.models]
        self.name = f"{inner.name}→{verifier.name}"
        self.rule = ExactRule()

    def prefill(self, tokens: list[int]) -> None:
        self.verifier.prefill(tokens)
        self.inner.prefill(tokens)

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        block: list[int] = []
        qs: list[torch.Tensor] = []
        mine, *below = self.blank_levels()
        while len(block) < gamma:
            seq = tokens + block
            draft = self._inner_draft(seq, min(self.level_gamma, gamma - len(block) - 1), sampler, stop, below)
            verdict, p, seconds = self._verify(seq, draft, sampler)
            n = verdict.accepted
            block += draft.ids[:n] + [verdict.next_token]
            qs.append(p[: n + 1])
            mine.passes += 1
            mine.ms += 1e3 * seconds
            mine.verifications.append([len(draft.ids), n + 1])
            mine.blocks.append({"drafted": draft.ids, "passed": block[len(block) - n - 1:]})
            if n < len(draft.ids):
                break
        return Draft(block, torch.cat(qs), self.name, [mine, *below])

    def _inner_draft(self, seq: list[int], k: int, sampler: Sampler, stop: StopRule | None, below: list[LevelRecord]) -> Draft:
        if k <= 0:
            return Draft([], None, self.inner.name)
        draft = self.inner.propose(seq, k, sampler, stop)
        merge_levels(below, draft.levels)
        return draft

    def blank_levels(self) -> list[LevelRecord]:
        return [LevelRecord(self.verifier.name, "verify"), *self.inner.blank_levels()]

    def _verify(self, seq: list[int], draft: Draft, sampler: Sampler) -> tuple[Verdict, torch.Tensor, float]:
        before = self.verifier.forward_s
        logits = self.verifier.forward(seq + draft.ids, keep=len(draft.ids) + 1).logits
        p = sampler.probs(logits)
        verdict = self.rule.verify(draft, logits, p, sampler)
        return verdict, p, self.verifier.forward_s - before


def build_chain(bottom: Drafter, verifiers: list[CachedModel], level_gamma: int = DEFAULT_LEVEL_GAMMA) -> Drafter:
    """Nest ``bottom`` → verifiers[0] → verifiers[1] … (fastest first); the engine's target verifies last."""
    drafter = bottom
    for verifier in verifiers:
        drafter = StagedDrafter(drafter, verifier, level_gamma)
    return drafter
