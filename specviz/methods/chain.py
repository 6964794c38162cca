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
from specviz.core.drafters import SINGLE_PATH, Draft, Drafter, LevelWork
from specviz.core.sampling import Sampler
from specviz.core.tree import Drawn, Expander, Feed, StopRule, TreeShape, grow_tree

DEFAULT_LEVEL_GAMMA = 4


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

    def draft(self, tokens: list[int], nodes: int, depth: int, shape: TreeShape, sampler: Sampler,
              stop: StopRule | None = None, keep_q: bool = True) -> Draft:
        """A block of up to ``nodes`` tokens grown as a single path: its tokens are what this level kept of the inner
        drafts and its own corrections, each with this level's distribution as q; ``stop`` applies to the inner drafts."""
        if shape != SINGLE_PATH:
            raise ValueError("a polybasic chain drafts single paths, not token trees")
        if nodes == 0:
            return Draft([], None, self.name)
        mine, *below = self.blank_levels()
        expand = self._expander(tokens, nodes, sampler, stop, keep_q, mine, below)
        grown = grow_tree(expand, shape, nodes, depth, sampler, keep_q=keep_q)
        return Draft(grown.tree.ids, grown.q, self.name, [mine, *below])

    def _expander(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None, keep_q: bool,
                  mine: LevelWork, below: list[LevelWork]) -> Expander:
        """The block's rows, one per node: each round the inner drafter drafts up to K tokens after the block so far,
        this level verifies them and the block grows by what it kept plus its own token; a rejection ends the block."""
        block: list[int] = []
        qs: list[torch.Tensor] = []
        ended = False

        def expand(feed: Feed) -> Drawn | torch.Tensor:
            nonlocal ended
            at = feed.depth  # the block's tokens drafted so far
            if at == len(block) and not ended and at < gamma:
                seq = tokens + block
                draft = self._inner_draft(seq, min(self.level_gamma, gamma - at - 1), sampler, stop, keep_q, below)
                verdict, p = self._verify(seq, draft, sampler, keep_q, mine)
                n = verdict.accepted
                block.extend([int(t) for t in draft.ids[:n]] + [verdict.next_token])  # ids the verification read
                qs.append(None if p is None else p[: n + 1])
                mine.verifications.append([len(draft.ids), n + 1])
                mine.blocks.append({"drafted": [int(t) for t in draft.ids], "passed": block[len(block) - n - 1:]})
                ended = n < len(draft.ids)
            if at >= len(block):
                return torch.full((1, self.verifier.vocab_size), -torch.inf)
            return Drawn(None if qs[0] is None else torch.cat(qs)[at: at + 1], block[at: at + 1])
        return expand

    def _inner_draft(self, seq: list[int], k: int, sampler: Sampler, stop: StopRule | None, keep_q: bool,
                     below: list[LevelWork]) -> Draft:
        draft = self.inner.draft(seq, k, k, SINGLE_PATH, sampler, stop, keep_q)
        for total, part in zip(below, draft.levels):
            total.merge(part)
        return draft

    def blank_levels(self) -> list[LevelWork]:
        return [LevelWork(self.verifier.name, "verify", self.verifier.times.watch), *self.inner.blank_levels()]

    def _verify(self, seq: list[int], draft: Draft, sampler: Sampler, keep_q: bool,
                work: LevelWork) -> tuple[Verdict, torch.Tensor | None]:
        """This level's verdict on the inner draft and its p, the q of the tokens it passes up (None where nothing reads
        it: greedy, unrecorded)."""
        start = work.watch.mark()
        logits = self.verifier.forward(seq + draft.ids, keep=len(draft.ids) + 1).logits
        work.passes += 1
        work.spans.append((start, work.watch.mark()))
        p = sampler.probs(logits) if keep_q or not sampler.greedy else None
        return self.rule.verify(draft, logits, sampler), p


def build_chain(bottom: Drafter, verifiers: list[CachedModel], level_gamma: int = DEFAULT_LEVEL_GAMMA) -> Drafter:
    """Nest ``bottom`` → verifiers[0] → verifiers[1] … (fastest first); the engine's target verifies last."""
    drafter = bottom
    for verifier in verifiers:
        drafter = StagedDrafter(drafter, verifier, level_gamma)
    return drafter
