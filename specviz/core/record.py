"""What a step records: a :class:`StepEvent` of typed records, one :class:`NodeRecord` per drafted node whatever the
shape (a single path is the tree of one child per node), the :class:`TreeRecord` they form, a scoring rule's own
:class:`Scores` and each polybasic level's :class:`LevelRecord` (:mod:`specviz.core.recorder` builds them). Dicts
appear only at the trace boundary (:meth:`StepEvent.to_dict` / :meth:`StepEvent.from_dict`), where a single path's
checked nodes keep their JSON place (``verify``) and a branching tree's nodes theirs (``tree.nodes``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from specviz.core.acceptance import UNCHECKED
from specviz.core.drafters import SINGLE_PATH, LevelWork
from specviz.core.tree import single_path

SPANS = {
    "deciding": "the draft selector and the γ policy: choosing before the draft, and learning from the step after its commit",
    "drafting": "the drafter's proposal (every level of a polybasic chain)",
    "verifying": "the target's verify forward and the acceptance test, up to the decision's one read from the device",
    "committing": "keeping the accepted tokens: the caches' rollback to the accepted path",
    "recording": "building the step's record (p and q of each token, the reasons), after every other span",
}
"""A step's time spans, in the order they run (the docs render this table)."""


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
    """One drafted node's verification, the one record of a drafted token for every shape (a single path's position i is
    node i, whose parent is i − 1): its token, parent and depth (1 below the root); p of its token at the stage it was
    checked (p after the residual updates of the siblings before it) and q; the test's acceptance probability and the
    uniform draw u (None when greedy); the verdict and its reason (None and ``unchecked``: never checked). The 10
    likeliest tokens of p (its parent's row) and of q; at the node the step's correction replaced, the target's argmax
    (greedy) or the residual it was drawn from (sampling)."""

    token: int
    parent: int
    depth: int
    p: float | None
    q: float
    u: float | None
    accepted: bool | None
    reason: str = UNCHECKED
    accept_prob: float | None = None
    p_top: list[list] = field(default_factory=list)
    q_top: list[list] = field(default_factory=list)
    argmax: int | None = None
    residual_top: dict | None = None

    OPTIONAL: ClassVar[tuple[str, ...]] = ("score", "threshold", "argmax", "residual_top")
    """The keys a node's JSON has only where they apply."""
    PATH_KEYS: ClassVar[dict[str, str]] = {
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
    """A single path's checked nodes, as JSON ``verify`` holds them (the docs render this table); a branching tree's
    nodes under ``tree.nodes`` hold the same keys and ``parent`` and ``depth``."""

    def to_dict(self, score: float | None = None, threshold: float | None = None, placed: bool = False) -> dict:
        """As JSON, with the rule's score and threshold of it where it has them, and where ``placed`` its parent and
        depth (a branching tree's node); the optional fields only where they apply."""
        values = {**{k: getattr(self, k) for k in self.PATH_KEYS if k not in ("score", "threshold")},
                  "score": score, "threshold": threshold}
        out = {k: v for k, v in values.items() if k not in self.OPTIONAL or v is not None}
        return {"token": self.token, "parent": self.parent, "depth": self.depth, **out} if placed else out

    @classmethod
    def from_dict(cls, data: dict, i: int, reason: str) -> NodeRecord:
        """Node ``i`` from its JSON: a branching tree's node, or position ``i`` of a single path (``verify``). A trace
        older than the shared record has no ``reason`` in its tree nodes (the step's own for the node is taken) and no
        acceptance probability (recomputed from p, q and the verdict: trees were verified by the exact rule only)."""
        kept = {k: v for k, v in data.items() if k not in ("score", "threshold")}
        if "accept_prob" not in kept and kept.get("accepted") is not None:
            kept["accept_prob"] = accept_probability(kept["p"], kept["q"], kept["u"] is None, kept["accepted"])
        return cls(**{"parent": i - 1, "depth": i + 1, "reason": reason, **kept})


def accept_probability(p: float, q: float, greedy: bool, exact: bool) -> float:
    """The exact test's acceptance probability of a checked draft: min(1, p/q) when sampling (1 where q is 0); when
    greedy, 1 or 0 as the draft is, or is not, the target's argmax (``exact``)."""
    return float(exact) if greedy else min(1.0, p / q) if q > 0 else 1.0


@dataclass(frozen=True)
class Scores:
    """A scoring rule's own criterion, apart from the exact test's: its score of each checked draft and the threshold a
    score must exceed (the judge head's scores and δ)."""

    scores: list[float]
    threshold: float


@dataclass
class TreeRecord:
    """A step's token tree: the run's kind and branching, each node's parent (−1: the root's child) and the accepted
    path (node indices, root down). A single path is the tree whose every parent is the node before it."""

    kind: str
    branch: int
    parents: list[int]
    accepted_path: list[int]

    KEYS: ClassVar[dict[str, str]] = {
        "kind": "`dynamic` or `static`",
        "branch": "children of each expanded node (static: the number of branches)",
        "parents": "each node's parent node index (−1: a child of the root, the last emitted token)",
        "accepted_path": "the accepted nodes' indices, root down",
        "nodes": "one object per node, with a `verify` entry's keys and its `parent` and `depth` (1 below the root): `p` "
                 "is that of its token at the stage it was checked; a node never checked has `p`, `u`, `accept_prob` and "
                 "`accepted` `null`, `p_top` and `q_top` empty",
    }
    """What each JSON key holds (the docs render this table)."""

    @property
    def branching(self) -> bool:
        return not single_path(self.parents)

    @classmethod
    def single_path(cls, drafted: int, accepted: int) -> TreeRecord:
        """A single path of ``drafted`` nodes whose first ``accepted`` were kept."""
        return cls(SINGLE_PATH.kind, SINGLE_PATH.branch, list(range(-1, drafted - 1)), list(range(accepted)))


@dataclass
class StepEvent:
    """Everything one step did, as the CLI, benchmark and UI see it: ``nodes`` holds one record per drafted node (every
    shape, in draft order), ``tree`` the tree they form, ``scores`` a scoring rule's own criterion."""

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
    spans: dict[str, float]
    total_ms: float
    forward_ms: float
    elapsed_ms: float
    tree: TreeRecord
    scores: Scores | None = None
    why: dict | None = None
    levels: list[LevelRecord] = field(default_factory=list)
    nodes: list[NodeRecord] = field(default_factory=list)
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
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"why", "extra", "verify", "tree", "untold"})

    @property
    def checked(self) -> list[NodeRecord]:
        """The nodes the step's verification checked and kept in its record (none past a stop token)."""
        return [node for node in self.nodes if node.accepted is not None]

    def to_dict(self) -> dict:
        """The step as JSON: a single path's checked nodes under ``verify``, a branching tree's nodes under ``tree``; the
        levels under ``extra`` (empty for a plain target step); the scoring rule's scores as ``judge_scores``."""
        own = ("tree", "scores", "levels", "nodes", "untold")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in own}
        out["judge_scores"] = None if self.scores is None else list(self.scores.scores)
        out["extra"] = {"levels": [asdict(level) for level in self.levels]} if self.levels else {}
        scores, threshold = (self.scores.scores, self.scores.threshold) if self.scores else ([], None)
        nodes = [n.to_dict(scores[i] if i < len(scores) else None, threshold, self.tree.branching) for i, n in enumerate(self.nodes)]
        if self.tree.branching:
            out["verify"], out["tree"] = [], {**asdict(self.tree), "nodes": nodes}
        else:
            out["verify"] = [node for node, n in zip(nodes, self.nodes) if n.accepted is not None]
        if self.untold is not None:
            out["untold"] = list(self.untold)
        return out

    @classmethod
    def json_keys(cls) -> tuple[set[str], set[str]]:
        """The keys a step's JSON must have, and those it may have."""
        return set(cls.KEYS) - cls.OPTIONAL, set(cls.KEYS)

    @classmethod
    def from_dict(cls, data: dict) -> StepEvent:
        """A step from its JSON (:meth:`to_dict`; an older trace's steps too, :func:`upgraded`), its records converted
        to node records: a single path's unchecked positions from its drafts, as the recorder leaves them."""
        data = upgraded(data)
        extra, verify, tree = data.pop("extra", None) or {}, data.pop("verify", None) or [], data.pop("tree", None)
        judge, reasons = data.pop("judge_scores", None), data["accept_reasons"]
        threshold = next((v["threshold"] for v in verify if v.get("threshold") is not None), None)
        if tree:
            nodes = [NodeRecord.from_dict(n, i, reasons[i]) for i, n in enumerate(tree["nodes"])]
            record = TreeRecord(**{k: v for k, v in tree.items() if k != "nodes"})
        else:
            record = TreeRecord.single_path(len(data["draft_ids"]), data["accepted"])
            unchecked = [NodeRecord(t, i - 1, i + 1, None, q, None, None, reasons[i])
                         for i, (t, q) in enumerate(zip(data["draft_ids"], data["draft_q"])) if i >= len(verify)]
            nodes = [NodeRecord.from_dict(v, i, reasons[i]) for i, v in enumerate(verify)] + unchecked
        return cls(**data, tree=record, nodes=nodes, levels=[LevelRecord(**level) for level in extra.get("levels", [])],
                   scores=None if judge is None else Scores(judge, threshold))


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
