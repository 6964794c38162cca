"""Token trees: a drafter proposes several continuations at once and the target scores every node in one forward.

Every draft is a tree (:class:`TokenTree`): a single path is the tree whose every node has one child. Nodes are listed in
the order they were drawn: parents before children, siblings in draw order; ``parents[i]`` is the index of node i's
parent, −1 for a child of the last committed token (the root). Row 0 of the target's verify forward is the root,
row i + 1 is node i.

Children are drawn *without replacement* from the draft's q: the top-k at T = 0, Gumbel-top-k at T > 0. Node i
carries the distribution it was drawn from (``Tree.q[i]``): its parent's q without the siblings drawn before it,
renormalised. Verification walks down from the root. Greedy: move to the child equal to the target's argmax.
Sampling (recursive rejection, as in SpecInfer): accept child c with probability min(1, p(c)/q(c)); on a rejection
p ← norm(max(p − q, 0)) and the next sibling is tried with its own q; when every child is rejected the token is
drawn from the last p. Each node's inclusion is decided from draw keys that say nothing of its own token (the
Gumbel maximum is independent of its argmax), so the output is distributed exactly as the target's.

Dynamic trees follow EAGLE-2: expand the ``branch`` nodes of the last level with the highest cumulative key, give
each ``branch`` children, and keep the budget's best nodes. Static trees are ``branch`` single paths from the root.

A greedy single path or static tree that nothing records and no stop rule reads is drawn without reading the device:
each node's id is a :class:`DeviceToken`, the argmax (or the root's top-k) left where it was computed, fed to the next
draft forward and to the target's verify as it is; the verification's one read settles every id of the step (:func:`settle`). A dynamic tree
reads each level's draw keys, since they choose which nodes grow: one read per level, for all its nodes.

Three types and a walk: :class:`TreeShape` (how a drafter grows trees, fixed for a run), :class:`TokenTree` (a step's nodes),
:func:`descend` (the walk every verification takes) and ``specviz.core.record.TreeRecord`` (what a step's view shows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.core.sampling import Sampler

TREE_KINDS = ("dynamic", "static")
MAX_TREE_NODES = 64
"""The largest node budget of a step (a cache with static shapes keeps this many slots free for the tree)."""



class DeviceToken:
    """A drafted token id still on the device (a 0-d long tensor) until the step's one read settles it (:func:`settle`).
    It compares and converts as its id; before it is settled, doing so reads it on its own."""

    __slots__ = ("tensor", "value")

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.value = tensor, None

    def __int__(self) -> int:
        if self.value is None:
            self.value = int(self.tensor)
        return self.value

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, int | DeviceToken) and int(self) == int(other))

    def __hash__(self) -> int:
        return hash(int(self))

    def __repr__(self) -> str:
        return f"DeviceToken({'unread' if self.value is None else self.value})"


def ids_tensor(ids: list[int], device: torch.device) -> torch.Tensor:
    """Token ids, some of them :class:`DeviceToken` (a greedy draft's), as a long tensor on ``device``, read from none."""
    if not any(isinstance(t, DeviceToken) for t in ids):
        return torch.tensor(ids, dtype=torch.long, device=device)
    return torch.stack([t.tensor.to(device) if isinstance(t, DeviceToken) else torch.tensor(t, device=device) for t in ids])


def settle(ids: list[int], values: list[int]) -> None:
    """Give each :class:`DeviceToken` among ``ids`` its id, as the step's one read read it."""
    for t, v in zip(ids, values):
        if isinstance(t, DeviceToken):
            t.value = v


@dataclass(frozen=True)
class Drawn:
    """Rows whose token the drafter already drew (one child each): a polybasic level's block, whose tokens come out of
    its own verification and are distributed as its q (None where nobody reads q: greedy, unrecorded)."""

    q: torch.Tensor | None
    ids: list[int]


Expander = Callable[[list[int], list[int], list[int]], "torch.Tensor | Drawn"]
"""``expand(ids, parents, new)``: the draft's logits (len(new), vocab) after each node in ``new`` of the tree (ids,
parents) so far; with ``new`` empty, the logits (1, vocab) after the committed tokens. A node is expanded after its
parent. A row of −inf: nothing can follow that node. Every drafter drafts through one (:func:`grow_tree`), which turns
logits into the draft's q under the run's sampling transform only where q is read."""

StopRule = Callable[[list[float]], bool]
"""Called as a node is drawn, with the draft's probability of each token on its path, root down (the node's own last);
True: the node stays in the draft but gets no children. It reads what drawing the node computed, so stopping costs no
draft forward; a policy that wants no draft at all asks for γ = 0."""


@dataclass(frozen=True)
class TreeShape:
    """How a drafter grows a run's token trees: ``branch`` children per expanded node, ``dynamic`` or ``static``. The
    node budget and depth of each step are the step's own (:func:`grow_tree`)."""

    branch: int
    kind: str


@dataclass(frozen=True)
class TokenTree:
    """A step's drafted nodes: token ids and each node's parent (−1: a child of the root)."""

    ids: list[int]
    parents: list[int]

    @classmethod
    def single_path(cls, ids: list[int]) -> TokenTree:
        """The tree in which each node has one child."""
        return cls(list(ids), list(range(-1, len(ids) - 1)))

    @property
    def is_single_path(self) -> bool:
        return single_path(self.parents)


def single_path(parents: list[int]) -> bool:
    """Whether the tree of these parents has one child per node."""
    return all(parent == i - 1 for i, parent in enumerate(parents))


def depths(parents: list[int]) -> list[int]:
    """Depth of every node (1 for the root's children)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def ancestry(parents: list[int]) -> torch.Tensor:
    """(n, n) bool: node i sees node j iff j is i or one of its ancestors (the tree attention mask among nodes)."""
    n = len(parents)
    seen = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[i] |= seen[parent]
    return seen


def children(logits: torch.Tensor | None, q: torch.Tensor | None, k: int, sampler: Sampler
             ) -> list[tuple[list[int], list[float], torch.Tensor | None]]:
    """For each row (a node or the root), up to ``k`` distinct tokens drawn without replacement from the draft's
    distribution after it: the top-k of its ``logits`` (or of ``q``; (rows, vocab) either) when greedy, Gumbel-top-k of
    ``q`` otherwise. Per row: their ids, their draw keys (log q, plus the Gumbel noise when sampling; decreasing; 0
    without q) and the distribution each was drawn from (q without the tokens drawn before it, renormalised; None without
    q). One read from the device for all the rows."""
    rank = (logits if logits is not None else q) if sampler.greedy else _gumbel_top(q, sampler)
    floor = -torch.inf if rank is logits else 0.0  # what a token nothing can draw scores
    top = rank.topk(min(k, rank.shape[-1]))
    if not sampler.greedy:
        keys = top.values.log()
    elif rank is logits:  # log q of the drawn tokens, q being the plain softmax a greedy run's q is, without computing q
        keys = top.values.float() - logits.float().logsumexp(-1, keepdim=True)
    else:
        keys = q.gather(-1, top.indices).log() if q is not None else torch.zeros_like(top.values)
    drawn = []
    for r, (ids, valid, row_keys) in enumerate(zip(*torch.stack([top.indices.double(), (top.values > floor).double(),
                                                                  keys.double()]).tolist())):
        n = int(sum(valid))  # the valid tokens come first: they score above the floor
        ids = [int(t) for t in ids[:n]]
        drawn.append((ids, row_keys[:n], None if q is None else _stages(q[r], ids)))
    return drawn


def _stages(q: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """The distribution each of ``ids`` was drawn from, in turn: ``q`` without the tokens drawn before it, renormalised."""
    if len(ids) <= 1:
        return q[None].float()
    stages = q.float().expand(len(ids), -1).clone()
    for j in range(1, len(ids)):
        stages[j:, ids[j - 1]] = 0
    return stages / stages.sum(-1, keepdim=True)


def _gumbel_top(q: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    """Scores whose top-k is a Gumbel-top-k draw from q: q / E with E ~ Exp(1) orders the tokens as log q + Gumbel noise
    does, with no log over the vocabulary (its log is the draw key)."""
    noise = torch.empty(q.shape, device=sampler.generator.device).exponential_(generator=sampler.generator)
    return q.float() / noise.to(q.device)


@dataclass(frozen=True)
class Grown:
    """What :func:`grow_tree` drew: the tree, each node's distribution (None where nothing reads it) and, where a stop
    rule read them, the draft probability of each node's token."""

    tree: TokenTree
    q: torch.Tensor | None
    confidence: list[float] | None = None


def grow_tree(expand: Expander, shape: TreeShape, nodes: int, depth: int, sampler: Sampler,
              stop: StopRule | None = None, keep_q: bool = True, finite: bool = False) -> Grown:
    """A tree of ``shape`` with at most ``nodes`` nodes, at most ``depth`` deep, drawn from the draft's distributions
    (:data:`Expander`; a single path is branch 1), the distribution each node was drawn from (nodes, vocab; None
    for no node, and without ``keep_q`` where nothing reads it) and, with a ``stop`` rule, the draft probability of each
    node's token, which the rule read (a node it stops gets no children). Greedy drafts computed without ``keep_q`` take
    no softmax over the vocabulary (their draw keys, log q, are the drawn logits less their log-sum-exp). If ``finite``
    (every row the expander returns holds a token) and no rule reads the draws, the ids of a greedy single path or static
    tree stay on the device (:class:`DeviceToken`); any other tree reads each level's draws once, a dynamic tree to
    choose the next frontier."""
    static = shape.kind == "static"
    need_q = keep_q or not sampler.greedy
    unread = finite and not need_q and stop is None and (static or shape.branch == 1)  # the shape is known ahead
    ids: list[int] = []
    parents: list[int] = []
    keys: list[float] = []  # cumulative key, capped by the parent's and the earlier sibling's (inclusion stays closed)
    qs: list[torch.Tensor | None] = []
    paths: list[list[float]] = []  # with a stop rule: the draft probability of each token on a node's path
    ended: set[int] = set()  # nodes the stop rule gave no children

    def draws(out: torch.Tensor | Drawn, k: int) -> list[tuple[list[int], list[float], torch.Tensor | None]]:
        """Each row's children as :func:`children` gives them."""
        logits, q = (None, out.q) if isinstance(out, Drawn) else (out, None)
        if q is None and need_q and logits is not None:
            q = sampler.probs(logits)
        if isinstance(out, Drawn):
            picked = torch.tensor(out.ids, dtype=torch.long)
            key = [0.0] * len(out.ids) if q is None else q.gather(-1, picked[:, None].to(q.device)).log()[:, 0].tolist()
            return [([t], [x], None if q is None else q[r][None]) for r, (t, x) in enumerate(zip(out.ids, key))]
        if unread:
            top = logits.argmax(-1)[:, None] if k == 1 else logits.topk(min(k, logits.shape[-1])).indices
            return [([DeviceToken(t) for t in row], [0.0] * top.shape[1], None) for row in top]
        return children(logits, q, k, sampler)

    def add(frontier: list[int], out: torch.Tensor | Drawn, k: int) -> list[int]:
        """Append the children of each frontier node (−1: the root), in order; their node indices."""
        new = []
        for parent, (drawn, drawn_keys, stages) in zip(frontier, draws(out, k)):
            base = cap = keys[parent] if parent >= 0 else 0.0
            for j, (child, x) in enumerate(zip(drawn, drawn_keys)):
                cap = min(cap, base + x)
                new.append(len(ids))
                ids.append(child)
                parents.append(parent)
                keys.append(cap)
                qs.append(None if stages is None else stages[j])
                if stop is not None:  # a greedy key is log q of the token; a sampled one carries noise: read q
                    paths.append((paths[parent] if parent >= 0 else []) + [
                        math.exp(x) if sampler.greedy or stages is None else float(stages[0][int(child)])])
                    if stop(paths[-1]):
                        ended.add(new[-1])
        return new

    width = min(shape.branch, nodes)
    level = add([-1], expand([], [], []), width)
    for _ in range(depth - 1):
        growing = [n for n in level if n not in ended]
        if static:
            frontier = growing[: nodes - len(ids)]
        else:
            frontier = sorted(growing, key=lambda n: (-keys[n], n))[: shape.branch]
        if not frontier:
            break
        if not static and len(ids) >= nodes and sorted(keys, reverse=True)[nodes - 1] >= keys[frontier[0]]:
            break  # no deeper node could enter the budget's best
        level = add(frontier, expand(ids, parents, frontier), 1 if static else shape.branch)
    keep = sorted(sorted(range(len(ids)), key=lambda n: (-keys[n], n))[: nodes])
    index = {old: new for new, old in enumerate(keep)}
    q = torch.stack([qs[n] for n in keep]) if keep and all(qs[n] is not None for n in keep) else None
    return Grown(TokenTree([ids[n] for n in keep], [index.get(parents[n], -1) for n in keep]), q,
                 [paths[n][-1] for n in keep] if stop is not None else None)


def descend(parents: list[int], test: Callable[[int], bool]) -> tuple[list[int], int, list[bool | None]]:
    """Walk down from the root, testing each row's children in order (``test(node)``: is it kept?) and moving to the
    first one kept: the accepted path (node indices, root down), the row it stopped at (0: the root, i + 1: node i) and
    each node's verdict (None: never tested)."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        kids[parent + 1].append(i)
    accepted: list[bool | None] = [None] * len(parents)
    path, row = [], 0
    while True:
        for c in kids[row]:
            accepted[c] = test(c)
            if accepted[c]:
                path.append(c)
                row = c + 1
                break
        else:
            return path, row, accepted
