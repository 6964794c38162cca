"""What a step records, apart from what it computes: the recorder turns a step's typed results (the draft, the
target's p, the verdict and the evidence it read, the step's :class:`~specviz.core.policy.Outcome`) into a
:class:`StepEvent` of typed records (:class:`VerifyRecord`, :class:`NodeRecord`, the judge's scores). Dicts appear
only at the trace boundary (:meth:`StepEvent.to_dict` / :meth:`StepEvent.from_dict`).

Without ``full`` recording (benchmarks) a step leaves out what only the views read (p and q of each token, the
verify records), and the recorder reads nothing from the device. With it, those reads come
after the step's last timing mark, so they never count as the step's time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import ClassVar

import torch

from specviz.core.acceptance import REJECTED, UNCHECKED, Verdict
from specviz.core.drafters import Draft, LevelWork
from specviz.core.policy import Outcome
from specviz.core.sampling import Sampler
from specviz.core.timing import Mark, Stopwatch
from specviz.core.tree import TreeShape, depths

TOP_K = 10
"""Alternatives recorded per verified position: the k most likely tokens of p, of q and of the residual."""

SPANS = {
    "deciding": "the draft selector and the γ policy: choosing before the draft, and learning from the step after its commit",
    "drafting": "the drafter's proposal (every level of a polybasic chain)",
    "verifying": "the target's verify forward and the acceptance test, up to the decision's one read from the device",
    "committing": "keeping the accepted tokens: the caches' rollback to the accepted path",
    "recording": "building the step's record (p and q of each token, the reasons), after every other span",
}
"""A step's time spans, in the order they run (the docs render this table)."""


@dataclass
class VerifyRecord:
    """One verified position of a single path (the accepted ones and the first rejection; later drafts are never checked):
    the token, p and q of it, the exact test's acceptance probability and the uniform draw u that decided it (None
    when greedy), the verdict and its reason, the top tokens of p and q; a judge run adds the score and δ; at a
    rejection, the target's argmax (greedy) or the residual the correction was drawn from (sampling)."""

    token: int
    p: float
    q: float
    accept_prob: float
    u: float | None
    accepted: bool
    reason: str
    p_top: list[list]
    q_top: list[list]
    score: float | None = None
    threshold: float | None = None
    argmax: int | None = None
    residual_top: dict | None = None

    KEYS: ClassVar[dict[str, str]] = {
        "token": "the drafted token id",
        "p": "the target's probability of it, after the sampling transform (temperature, top-p; greedy: the plain softmax)",
        "q": "the draft's probability of it, likewise",
        "accept_prob": "min(1, p/q) when sampling; 1 or 0 when greedy (the draft is, or is not, the target's argmax)",
        "u": "the uniform draw the exact test used (u·q < p accepts); `null` when greedy",
        "accepted": "the verdict",
        "reason": "why: `exact`, `judge`, `lenient`, `topk` or `rejected`",
        "p_top": "the 10 likeliest tokens of p, as [token, probability] pairs",
        "q_top": "the same for q (pairs with probability 0 left out)",
        "score": "the judge head's score (judge rule only)",
        "threshold": "the judge's δ (judge rule only)",
        "argmax": "at a greedy rejection: the target's argmax, which is emitted",
        "residual_top": "at a sampled rejection: `top`, the 10 likeliest tokens of the residual max(0, p − q) normalised, "
                        "and `emitted`, the token drawn from it",
    }
    """What each JSON key holds (the docs render this table)."""

    def to_dict(self) -> dict:
        """As JSON; the judge's and the rejection's fields only where they apply."""
        optional = ("score", "threshold", "argmax", "residual_top")
        return {k: v for k, v in asdict(self).items() if k not in optional or v is not None}


@dataclass
class LevelRecord:
    """One level's work in one proposal: forwards (or lookups) and milliseconds; for a verifying level of a polybasic chain,
    one [drafted, passed up] pair per verification and the token ids of each (``blocks``: drafted, passed)."""

    name: str
    role: str
    passes: int = 0
    ms: float = 0.0
    verifications: list[list[int]] = field(default_factory=list)
    blocks: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, work: LevelWork) -> LevelRecord:
        """The record of measured work: its spans read as milliseconds."""
        ms = 1e3 * sum(work.watch.seconds(start, end) for start, end in work.spans)
        return cls(work.name, work.role, work.passes, ms, work.verifications, work.blocks)


@dataclass
class NodeRecord:
    """One node's verification: p and q of its token at the stage it was checked (p after the residual updates of the
    siblings before it), the uniform draw u (None when greedy or unchecked) and the verdict (None: never checked)."""

    token: int
    parent: int
    depth: int
    p: float | None
    q: float
    u: float | None
    accepted: bool | None


@dataclass
class TreeRecord:
    """A step's token tree: kind and branching, each node's parent (−1: the root's child), the accepted path (node
    indices, root down) and every node's verification."""

    kind: str
    branch: int
    parents: list[int]
    accepted_path: list[int]
    nodes: list[NodeRecord]

    KEYS: ClassVar[dict[str, str]] = {
        "kind": "`dynamic` or `static`",
        "branch": "children of each expanded node (static: the number of branches)",
        "parents": "each node's parent node index (−1: a child of the root, the last emitted token)",
        "accepted_path": "the accepted nodes' indices, root down",
        "nodes": "one object per node: `token`, `parent`, `depth` (1 below the root), `p` and `q` of its token at the "
                 "stage it was checked, `u` (`null` when greedy or never checked), `accepted` (`null`: never checked)",
    }
    """What each JSON key holds (the docs render this table)."""


@dataclass
class StepEvent:
    """Everything one step did, as the CLI, benchmark and UI see it."""

    step: int
    drafter: str
    gamma: int
    drafted: int
    draft_ids: list[int | None]
    draft_q: list[float]
    draft_p: list[float]
    accepted: int
    emitted_ids: list[int]
    emitted_p: list[float]
    accept_reasons: list[str]
    judge_scores: list[float] | None
    spans: dict[str, float]
    total_ms: float
    forward_ms: float
    elapsed_ms: float
    why: dict | None = None
    levels: list[LevelRecord] = field(default_factory=list)
    verify: list[VerifyRecord] = field(default_factory=list)
    tree: TreeRecord | None = None
    untold: list[str] | None = None

    KEYS: ClassVar[dict[str, str]] = {
        "step": "1-based step number",
        "drafter": "the drafter's name, or `target` for a plain step",
        "gamma": "the γ budget the policy chose for this step (a tree: its node budget; 0: a plain step)",
        "drafted": "tokens (a tree: nodes) drafted this step: the budget, or fewer at the token limit, at a stop rule or "
                   "where the drafter had no more",
        "draft_ids": "the drafted token ids (a tree: its nodes, in the order `tree.parents` indexes; a server's step: `null` "
                     "where the server does not say)",
        "draft_q": "the draft's probability of each drafted token",
        "draft_p": "the target's probability of each drafted token",
        "accepted": "drafted tokens kept",
        "emitted_ids": "tokens this step emitted: the kept drafts and the target's own token",
        "emitted_p": "the target's probability of each emitted token",
        "accept_reasons": "why each kept token was kept: `exact`, `judge`, `lenient` or `topk`",
        "judge_scores": "the judge head's score of each checked draft (`null` unless `--accept judge`)",
        "spans": "the step's time in ms, one key per span (below); they add up to `total_ms`",
        "total_ms": "the whole step, from its decision to the end of its record",
        "forward_ms": "time inside model forwards",
        "elapsed_ms": "time from the start of the run (its prefill included) to the end of this step",
        "why": "`policy`: the γ policy's reasons for the step's γ (its `policy` key names it); `selector`: the draft "
               "selector's for its drafter (its `selector` key names it; `null` without draft selection); `null` when "
               "the run does not record (benchmarks)",
        "extra": "`levels`: per level of a polybasic chain, its `name`, `role` (`verify` / `draft`), `passes`, `ms`, "
                 "`verifications` and `blocks`; `{}` for a plain target step",
        "verify": "a single path's verified positions, one object each (below); empty for a tree step",
        "tree": "a tree step's token tree (below); absent from a single path's step",
        "untold": "a server's step only: what the server does not report (`rejected_ids`: the rejected drafts' ids, "
                  "`null` in `draft_ids`; `p`, `q`; `times`: per-step times, zero here)",
    }
    """What each JSON key holds (the docs render this table)."""

    def to_dict(self) -> dict:
        """The step as JSON; the levels go under ``extra`` (empty for a plain target step), and a single path's step has no
        ``tree`` key."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("levels", "verify", "tree", "untold")}
        out["extra"] = {"levels": [asdict(level) for level in self.levels]} if self.levels else {}
        out["verify"] = [v.to_dict() for v in self.verify]
        if self.tree is not None:
            out["tree"] = asdict(self.tree)
        if self.untold is not None:
            out["untold"] = list(self.untold)
        return out

    @classmethod
    def json_keys(cls) -> tuple[set[str], set[str]]:
        """The keys a step's JSON must have, and those it may have."""
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        return required, {f.name for f in fields(cls)} - {"levels"} | {"extra"}

    @classmethod
    def from_dict(cls, data: dict) -> StepEvent:
        """A step from its JSON (:meth:`to_dict`; an older trace's steps too, :func:`upgraded`)."""
        data = upgraded(data)
        extra, verify, tree = data.pop("extra", None) or {}, data.pop("verify", None) or [], data.pop("tree", None)
        return cls(**data, levels=[LevelRecord(**level) for level in extra.get("levels", [])],
                   verify=[VerifyRecord(**v) for v in verify],
                   tree=TreeRecord(**{**tree, "nodes": [NodeRecord(**n) for n in tree["nodes"]]}) if tree else None)


@dataclass(frozen=True)
class StepMarks:
    """A step's stopwatch marks in order: its start, the decision (selector and policy), the draft, the verdict (the
    target's forward and the acceptance test, whose decision the host read), the commit, and the end of the policies'
    learning from the outcome (which counts as deciding)."""

    start: Mark
    decided: Mark
    drafted: Mark
    verified: Mark
    committed: Mark
    learned: Mark


def span_ms(watch: Stopwatch, start: Mark, end: Mark) -> float:
    return 1e3 * watch.seconds(start, end)


class Recorder:
    """Builds a decode's StepEvents from the stopwatch and what each step computed; with ``full``, what the views read
    (the target's p under ``sampler``'s transform among it)."""

    def __init__(self, watch: Stopwatch, start: Mark, sampler: Sampler, full: bool = True):
        self.watch, self.start, self.sampler, self.full = watch, start, sampler, full

    def step(self, step: int, outcome: Outcome, draft: Draft, gamma: int, logits: torch.Tensor, verdict: Verdict,
             emitted: list[int], marks: StepMarks, forward_ms: float, why: Callable[[], dict], shape: TreeShape) -> StepEvent:
        """The StepEvent of a step whose policy chose ``gamma`` (a tree: its node budget), drafted ``draft`` under
        ``shape``, scored it to ``logits``, decided ``verdict`` and emitted ``emitted``; ``why()`` builds its reasons
        (only here, and only with ``full``). Its spans are read from ``marks`` and, for recording, from this call's own
        end. The record ends where the output does: at a stop token among the accepted drafts, the drafts below it read
        as never checked."""
        p = self.sampler.probs(logits) if self.full else None
        path, below = verdict.path[: len(emitted)], stopped_below(verdict, draft, len(emitted))
        reasons = [UNCHECKED if i in below else kept for i, kept in enumerate(verdict.reasons)]
        full, ev = self.full, verdict.evidence
        rows = [0] + [i + 1 for i in path]
        tree = None  # decided by the tree drafted, as the target and the rule decide: a single path has no tree record
        if not draft.tree.is_single_path:
            nodes_seen = node_records(draft, verdict, p, below) if full else []
            tree = TreeRecord(shape.kind, shape.branch, draft.parents, path, nodes_seen)
        scores = ev.scores if ev is not None and full else None
        views = dict(draft_q=draft.q_of_ids() if full else [],
                     draft_p=probs_at(p, draft.ids, [parent + 1 for parent in draft.parents]) if full else [],
                     emitted_p=probs_at(p, emitted, rows[: len(emitted)]) if full else [],
                     judge_scores=None if scores is None else scores.tolist(), why=why() if full else None,
                     levels=[LevelRecord.of(work) for work in draft.levels],
                     verify=verify_records(draft, verdict, p, len(emitted)) if full and tree is None else [], tree=tree)
        end, w, m = self.watch.mark(), self.watch, marks
        spans = {"deciding": span_ms(w, m.start, m.decided) + span_ms(w, m.committed, m.learned),
                 "drafting": span_ms(w, m.decided, m.drafted), "verifying": span_ms(w, m.drafted, m.verified),
                 "committing": span_ms(w, m.verified, m.committed), "recording": span_ms(w, m.learned, end)}
        return StepEvent(step=step, drafter=draft.drafter, gamma=gamma, drafted=len(draft.ids), draft_ids=draft.ids,
                         accepted=outcome.accepted, emitted_ids=emitted, accept_reasons=reasons, spans=spans,
                         total_ms=span_ms(w, m.start, end), forward_ms=forward_ms, elapsed_ms=span_ms(w, self.start, end),
                         **views)


OLD_SPLIT = ("draft_ms", "verify_ms", "overhead_ms")
"""A version-1 or 2 step's time split, which its spans replace."""


def upgraded(data: dict) -> dict:
    """A step of a version-1 or 2 trace in this version's keys (a copy; any other step as it is). Its draft, verify and
    overhead ms become the drafting, verifying and committing spans (those versions counted the decision as drafting
    and the policies' learning as overhead, and did not time recording: both read 0); its merged reasons become the
    policy's; its drafted count is its draft's length."""
    if "spans" in data or not set(OLD_SPLIT) <= set(data):
        return dict(data)
    new = {k: v for k, v in data.items() if k not in (*OLD_SPLIT, "policy")}
    drafting, verifying, committing = (data[k] for k in OLD_SPLIT)
    new["spans"] = {"deciding": 0.0, "drafting": drafting, "verifying": verifying, "committing": committing, "recording": 0.0}
    new["why"] = {"policy": data.get("policy"), "selector": None}
    new.setdefault("drafted", len(data.get("draft_ids") or []))
    return new


def stopped_below(verdict: Verdict, draft: Draft, emitted: int) -> set[int]:
    """The drafts a stop token among the accepted ones cut off (a single path's later positions, a tree's stop node's
    subtree): a step that emitted no more tokens than its accepted drafts ended there. Empty for any other step."""
    if emitted > verdict.accepted:
        return set()
    stop, below = verdict.path[emitted - 1], set()
    for i, parent in enumerate(draft.parents):  # parents come before their children
        if parent == stop or parent in below:
            below.add(i)
    return below


def node_records(draft: Draft, verdict: Verdict, p: torch.Tensor, below: set[int]) -> list[NodeRecord]:
    """One :class:`NodeRecord` per node of a branching tree, from the verdict's evidence; the nodes in ``below`` read as
    never checked."""
    ev, n = verdict.evidence, len(draft.ids)
    accepted, u = ev.accepted, ev.u or [None] * n
    px = ev.p or probs_at(p, draft.ids, [parent + 1 for parent in draft.parents])
    qx, deep = draft.q_of_ids(), depths(draft.parents)
    return [NodeRecord(t, parent, d, None if hit is None or i in below else px[i], q, None if hit is None or i in below else u[i],
                       None if i in below else hit)
            for i, (t, parent, d, q, hit) in enumerate(zip(draft.ids, draft.parents, deep, qx, accepted))]


def verify_records(draft: Draft, verdict: Verdict, p: torch.Tensor, emitted: int) -> list[VerifyRecord]:
    """One :class:`VerifyRecord` per verified position of a single path that emitted ``emitted`` tokens (none past a stop
    token), from what its decision read and the target's ``p`` of the step. Reading these changes nothing the rule
    decided."""
    ev = verdict.evidence
    if ev is None:
        return []
    n, m = verdict.accepted, min(emitted, len(draft.ids))
    rows, ids = torch.arange(m, device=p.device), torch.tensor(draft.ids[:m], dtype=torch.long, device=p.device)
    q = draft.q_over(p.shape[-1], p.device)
    px, qx = p[rows, ids].tolist(), q[rows, ids].tolist()
    k = min(TOP_K, p.shape[-1])
    p_top, q_top = _pairs(p[:m].topk(k)), _pairs(q[:m].topk(k))  # one transfer each, not one per row
    u = ev.u or [None] * m
    scores = None if ev.scores is None else ev.scores.tolist()
    out = []
    for i in range(m):
        out.append(VerifyRecord(
            token=draft.ids[i], p=px[i], q=qx[i],
            accept_prob=float(ev.exact[i]) if ev.u is None else min(1.0, px[i] / qx[i]) if qx[i] > 0 else 1.0,
            u=u[i], accepted=i < n, reason=verdict.reasons[i] if i < n else REJECTED, p_top=p_top[i],
            q_top=[pair for pair in q_top[i] if pair[1] > 0], score=None if scores is None else scores[i],
            threshold=None if scores is None else ev.threshold))
    if n < m:
        if ev.corrected is None:
            out[n].argmax = verdict.next_token
        else:
            top = _pairs(ev.corrected[None].topk(k))[0]
            out[n].residual_top = {"top": [pair for pair in top if pair[1] > 0], "emitted": verdict.next_token}
    return out


def probs_at(p: torch.Tensor, ids: list[int], rows: list[int] | None = None) -> list[float]:
    """p[rows[i], ids[i]] for each i (rows 0, 1, … unless given)."""
    index = torch.arange(len(ids), device=p.device) if rows is None else torch.tensor(rows, dtype=torch.long, device=p.device)
    return p[index, torch.tensor(ids, dtype=torch.long, device=p.device)].tolist()


def _pairs(top) -> list[list[list]]:
    """[token, value] pairs per row of a batched ``topk``, read from the device in one transfer."""
    both = torch.stack([top.indices.double(), top.values.double()]).tolist()  # float64 holds every token id exactly
    return [[[int(t), x] for t, x in zip(ids, values)] for ids, values in zip(*both)]

