"""Acceptance rules: decide how much of a draft the target keeps and which token it adds.

Every rule returns a :class:`Verdict`. The exact rule is lossless: greedy keeps drafts equal to the
target's argmax; sampling is Leviathan et al.'s rule with the residual ``norm(max(0, p − q))`` and a
bonus token drawn from ``p_{γ+1}`` when everything was accepted. The relaxed rules (judge, lenient,
top-k) keep a token when the exact rule accepts it **or** their own criterion does, then finish the
step exactly as the exact rule would — so with the criterion switched off they reproduce it token for
token, random draws included.

Every draft is a token tree (a single path is the tree with one child per node) and :meth:`ExactRule.verify` is the one
entry point for every shape. Each node is tested against its parent's row; a row's first child sees the target's p
untouched, so every first child is tested in one vectorised pass (a single path is nothing else) and greedy reads the
device once. A later sibling, tried after a rejection, is tested against the residual its earlier siblings left
(recursive rejection, as in SpecInfer), which the exact rule alone accepts: a lossy rule refuses a branching tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.core.drafters import Draft
from specviz.core.registry import ACCEPT_RULES
from specviz.core.sampling import Sampler, residual
from specviz.core.tree import TokenTree, descend, ids_tensor, settle

ACCEPTED, REJECTED, UNCHECKED = "exact", "rejected", "unchecked"


@dataclass(frozen=True)
class Relaxed:
    """A rule's own criterion, per node: what it accepts beyond the exact test, and for a scoring rule (the judge) its
    scores and the threshold they must exceed."""

    accepts: torch.Tensor
    scores: torch.Tensor | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Evidence:
    """What verifying a draft read, per node (None: never checked): the verdict, the exact test's own outcome, the
    rule's own criterion (:class:`Relaxed`), and when sampling the target's p of the node's token at the stage it was
    tested, the uniform draw u and the residual the correction was drawn from (after a rejection)."""

    accepted: list[bool | None]
    exact: list[bool | None]
    relaxed: Relaxed
    p: list[float | None] | None = None
    u: list[float | None] | None = None
    corrected: torch.Tensor | None = None


@dataclass(frozen=True)
class Verdict:
    """The accepted drafts (node indices, root down), then ``next_token`` from the target; one reason per drafted node;
    what the decision read (``evidence``: none for an empty draft), for the recorder (:mod:`specviz.core.record`)."""

    path: list[int]
    next_token: int
    reasons: list[str]
    evidence: Evidence | None = None

    @property
    def accepted(self) -> int:
        return len(self.path)


@dataclass
class Checked:
    """What a rule sees for the drafted nodes: ids, the target's logits and p (None when the greedy test does not read
    it) of each node's parent row, the draft's q and the uniform draws of the exact test (both None when greedy), the
    target's pre-norm states (a row per fed position: the root, then each node)."""

    ids: torch.Tensor
    logits: torch.Tensor
    p: torch.Tensor | None
    q: torch.Tensor | None
    u: torch.Tensor | None
    states: torch.Tensor | None

    def px_qx(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(len(self.ids), device=self.ids.device)
        return self.p[rows, self.ids], self.q[rows, self.ids]


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
        tree = draft.tree
        if not tree.is_single_path and type(self) is not ExactRule:
            raise ValueError(f"token trees are verified by the exact rule only, not {self.name}")
        n, device = len(tree.ids), logits.device
        ids, parents = ids_tensor(tree.ids, device), ids_tensor(tree.parents, device)
        rows = parents + 1
        q = None if sampler.greedy else draft.q_over(p.shape[-1], device)
        c = Checked(ids, logits[rows], None if p is None else p[rows], q, None if q is None else sampler.uniform(n, device), states)
        if sampler.greedy:
            best = logits.argmax(-1)
            exact = ids == best[rows]
            relaxed = self.relaxed(c)
            read = torch.cat([(exact | relaxed.accepts).long(), exact.long(), best, ids, parents]).tolist()  # the step's one read
            settle(tree.ids, read[2 * n + len(best): 3 * n + len(best)])
            settle(tree.parents, read[3 * n + len(best):])
            path, row, accepted = descend(tree.parents, lambda node: bool(read[node]))
            evidence = Evidence(accepted, [None if a is None else bool(read[n + i]) for i, a in enumerate(accepted)], relaxed)
            return Verdict(path, read[2 * n + row], self.reasons(evidence), evidence)
        return self._sampled(tree, c, p, sampler)

    def _sampled(self, tree: TokenTree, c: Checked, p: torch.Tensor, sampler: Sampler) -> Verdict:
        """Recursive rejection down ``tree``: a node is kept if u·q < p (or by the rule's criterion); after a rejection
        its row's p becomes the residual norm(max(0, p − q)), which the row's next child is tested against and, if every
        child is rejected, the correction is drawn from."""
        px, qx = c.px_qx()
        exact = c.u * qx < px
        relaxed = self.relaxed(c)
        ok, hit, u, px, qx = torch.stack([(exact | relaxed.accepts).double(), exact.double(), c.u.double(), px.double(),
                                          qx.double()]).tolist()
        stage: dict[int, torch.Tensor] = {}  # a row's p after the rejections of its children so far

        def test(node: int) -> bool:
            row = tree.parents[node] + 1
            if row in stage:  # an earlier sibling was rejected (a branching tree: the exact rule only)
                px[node] = float(stage[row][tree.ids[node]])
                hit[node] = ok[node] = u[node] * qx[node] < px[node]
            if not ok[node]:
                stage[row] = residual(stage.get(row, p[row]), c.q[node])
            return bool(ok[node])

        path, row, accepted = descend(tree.parents, test)
        corrected = stage.get(row)
        next_token = int(sampler.draw(p[row] if corrected is None else corrected))
        seen = [a is not None for a in accepted]
        evidence = Evidence(accepted, [bool(h) if s else None for h, s in zip(hit, seen)], relaxed,
                            [x if s else None for x, s in zip(px, seen)], [x if s else None for x, s in zip(u, seen)], corrected)
        return Verdict(path, next_token, self.reasons(evidence), evidence)

    def reasons(self, evidence: Evidence) -> list[str]:
        """Why each node was kept (the exact test, or this rule's criterion), rejected or never checked."""
        return [UNCHECKED if a is None else (ACCEPTED if e else self.name) if a else REJECTED
                for a, e in zip(evidence.accepted, evidence.exact)]

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
