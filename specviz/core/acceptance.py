"""Acceptance rules: decide how much of a draft the target keeps and which token it adds.

Every rule returns a :class:`Verdict`. The exact rule is lossless: greedy keeps drafts equal to the
target's argmax; sampling is Leviathan et al.'s rule with the residual ``norm(max(0, p − q))`` and a
bonus token drawn from ``p_{γ+1}`` when everything was accepted. The relaxed rules (judge, lenient,
top-k) keep a token when the exact rule accepts it **or** their own criterion does, then finish the
step exactly as the exact rule would — so with the criterion switched off they reproduce it token for
token, random draws included.

Every draft is a token tree (a single path is the tree with one child per node) and :meth:`ExactRule.verify` is the one
entry point: a single-path tree is tested in one batch as above, a branching one by recursive rejection
(:func:`specviz.core.tree.verify_tree`), which the exact rule alone accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.core.drafters import Draft
from specviz.core.registry import ACCEPT_RULES
from specviz.core.sampling import Sampler, residual
from specviz.core.tree import TreeEvidence, verify_tree

ACCEPTED, REJECTED, UNCHECKED = "exact", "rejected", "unchecked"


@dataclass(frozen=True)
class Verdict:
    """The accepted drafts (node indices, root down: a single path's first ones), then ``next_token`` from the target; one
    reason per drafted node; what the decision read (``evidence``: none for an empty draft), for the recorder
    (:mod:`specviz.core.record`)."""

    path: list[int]
    next_token: int
    reasons: list[str]
    evidence: Evidence | TreeEvidence | None = None

    @property
    def accepted(self) -> int:
        return len(self.path)


def reasons_for(accepted: int, drafted: int, kept_as: list[str] | None = None) -> list[str]:
    kept = kept_as or [ACCEPTED] * accepted
    tail = [REJECTED] + [UNCHECKED] * (drafted - accepted - 1) if accepted < drafted else []
    return kept + tail


@dataclass
class Checked:
    """What a rule sees for the γ drafted positions: ids, target logits and p (None when the greedy test does not read
    it), the draft's q and the uniform draws of the exact test (both None when greedy), the target's pre-norm states
    (γ + 1 rows)."""

    ids: torch.Tensor
    logits: torch.Tensor
    p: torch.Tensor | None
    q: torch.Tensor | None
    u: torch.Tensor | None
    states: torch.Tensor | None

    def px_qx(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(len(self.ids), device=self.ids.device)
        return self.p[rows, self.ids], self.q[rows, self.ids]


@dataclass(frozen=True)
class Relaxed:
    """What a rule accepts beyond the exact test, per position, and the judge's scores and δ when it has them."""

    accepts: torch.Tensor
    scores: torch.Tensor | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Evidence:
    """What a single path's decision read: the checked positions, the exact test's outcome at each, the rule's own criterion
    (the judge's scores and δ), and the residual the correction was drawn from (sampling, after a rejection)."""

    checked: Checked
    exact: torch.Tensor
    relaxed: Relaxed
    corrected: torch.Tensor | None


@ACCEPT_RULES.register("Lossless: accept with probability min(1, p/q); greedy: accept the target's argmax.")
class ExactRule:
    """Standard (lossless) speculative verification; subclasses add a criterion in :meth:`relaxed`."""

    name = "exact"
    needs_states = False
    greedy_reads_p = False  # whether the greedy test reads the target's p, not only its logits

    @classmethod
    def from_settings(cls, settings, target) -> ExactRule:
        """The registry's protocol: a rule from the run's settings (a DecodeConfig) and the target (a LoadedModel); by
        default the rule's registered settings, in order, are its constructor's arguments."""
        return cls(*(getattr(settings, name) for name in ACCEPT_RULES.entry(cls.name).params))

    def reads_layers(self, n_layers: int) -> tuple[int, ...]:
        """The target's decoder layers (of ``n_layers``) whose outputs the rule reads: the last, for its pre-norm states."""
        return (n_layers - 1,) if self.needs_states else ()

    def verify(self, draft: Draft, logits: torch.Tensor, sampler: Sampler, states: torch.Tensor | None = None) -> Verdict:
        """The verdict on ``draft`` scored to ``logits`` (rows: the root, then each node); ``states``: the target's
        pre-norm states of those rows, for rules that read them. The target's p (the sampling transform of the logits)
        is computed only where the test reads it: a greedy exact test reads the logits alone."""
        p = None if sampler.greedy and not self.greedy_reads_p else sampler.probs(logits)
        if not draft.ids:
            return Verdict([], int(sampler.pick(logits[0], None if p is None else p[0])), [])
        if not draft.tree.is_single_path:
            if type(self) is not ExactRule:
                raise ValueError(f"token trees are verified by the exact rule only, not {self.name}")
            path, nxt, evidence = verify_tree(draft.tree, None if p is None else draft.q_over(p.shape[-1], p.device), logits, p, sampler)
            reasons = [ACCEPTED if hit else UNCHECKED if hit is None else REJECTED for hit in evidence.accepted]
            return Verdict(path, nxt, reasons, evidence)
        return self._verify_path(draft, logits, p, sampler, states)

    def _verify_path(self, draft: Draft, logits: torch.Tensor, p: torch.Tensor | None, sampler: Sampler,
                      states: torch.Tensor | None) -> Verdict:
        gamma = len(draft.ids)
        ids = torch.tensor(draft.ids, dtype=torch.long, device=logits.device)
        if sampler.greedy:
            best = logits.argmax(-1)
            c = Checked(ids, logits[:gamma], None if p is None else p[:gamma], None, None, states)
            exact = ids == best[:gamma]
            relaxed = self.relaxed(c)
            kept = (exact | relaxed.accepts).long().cumprod(0)
            read = torch.cat([kept.sum()[None], exact.long(), best]).tolist()  # the step's one device read
            n = read[0]
            reasons = [ACCEPTED if hit else self.name for hit in read[1:1 + n]]
            return Verdict(list(range(n)), read[1 + gamma + n], reasons_for(n, gamma, reasons), Evidence(c, exact, relaxed, None))
        q = draft.q_over(p.shape[-1], p.device)
        c = Checked(ids, logits[:gamma], p[:gamma], q, sampler.uniform(gamma, p.device), states)
        px, qx = c.px_qx()
        exact = c.u * qx < px
        relaxed = self.relaxed(c)
        n = first_false(exact | relaxed.accepts)
        kept = [ACCEPTED if hit else self.name for hit in exact[:n].tolist()]
        corrected = None if n == gamma else residual(p[n], c.q[n])
        nxt = int(sampler.draw(p[gamma] if corrected is None else corrected))
        return Verdict(list(range(n)), nxt, reasons_for(n, gamma, kept), Evidence(c, exact, relaxed, corrected))

    def relaxed(self, c: Checked) -> Relaxed:
        """Acceptances beyond the exact rule (none here)."""
        return Relaxed(torch.zeros_like(c.ids, dtype=torch.bool))


@ACCEPT_RULES.register("Leviathan's lenience l: accept with probability min(1, p/(l·q)); l = 1 is exact.", ("lenience",))
class LenientRule(ExactRule):
    """Leviathan's lenience l ∈ (0, 1]: sampling accepts with min(1, p/(l·q)) (same draw as the exact
    test); greedy accepts a draft whose target probability is ≥ l × the top one. l = 1 is exact."""

    name = "lenient"
    greedy_reads_p = True

    def __init__(self, lenience: float):
        self.lenience = lenience

    def relaxed(self, c: Checked) -> Relaxed:
        if c.u is None:
            rows = torch.arange(len(c.ids), device=c.ids.device)
            return Relaxed(c.p[rows, c.ids] >= self.lenience * c.p.max(-1).values)
        px, qx = c.px_qx()
        return Relaxed(c.u * qx * self.lenience < px)


@ACCEPT_RULES.register("Accept a draft token that is among the target's k most likely.", ("topk",))
class TopKRule(ExactRule):
    """Accept a draft token that is among the target's k most likely tokens."""

    name = "topk"

    def __init__(self, k: int):
        self.k = k

    def relaxed(self, c: Checked) -> Relaxed:
        top = c.logits.topk(min(self.k, c.logits.shape[-1]), dim=-1).indices
        return Relaxed((top == c.ids[:, None]).any(-1))




def first_false(mask: torch.Tensor) -> int:
    """Length of the leading run of True."""
    misses = (~mask).nonzero()
    return int(misses[0]) if len(misses) else len(mask)
