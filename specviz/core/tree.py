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

A greedy draft that nothing records and no stop rule reads is drawn without reading the device: each node's id is a
:class:`DeviceToken`, the argmax (or a row's top-k) left where it was computed, fed to the next draft forward and to the
target's verify as it is; the verification's one read settles every id of the step (:func:`settle`). A single path's
or a static tree's shape is known ahead. A dynamic tree's is not: its draw keys choose which nodes grow. Where a read
waits for the device (:func:`reads_wait`: an accelerator), the frontier is chosen on the device and the nodes' parents
are :class:`DeviceToken` too, settled by the same read. Whether growth may stop (no deeper node could enter the budget's
best) is copied to the host without waiting and read a level later, so the tree grows at most one level further than
reading would let it, and keeps the same nodes. On a CPU, where a read costs nothing, each level's draw keys are read
once, and growth stops as soon as it may.

Four types and a walk: :class:`TreeShape` (how a drafter grows trees, fixed for a run), :class:`Feed` (what one draft
forward feeds), :class:`TokenTree` (a step's nodes), :func:`descend` (the walk every verification takes) and
``specviz.core.record.TreeRecord`` (what a step's view shows).
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
    return torch.stack([t.tensor.to(device) if isinstance(t, DeviceToken) else torch.full((), t, device=device) for t in ids])


def settle(ids: list[int], values: list[int]) -> None:
    """Give each :class:`DeviceToken` among ``ids`` its value, as the step's one read read it, and put the value in its
    place in ``ids`` (other lists holding the token read it from the token)."""
    for i, (t, v) in enumerate(zip(ids, values)):
        if isinstance(t, DeviceToken):
            t.value = ids[i] = v


def reads_wait(device: torch.device) -> bool:
    """Whether reading a tensor on ``device`` waits for the work queued on it (an accelerator; a CPU computes in line)."""
    return device.type != "cpu"


@dataclass(frozen=True)
class Drawn:
    """Rows whose token the drafter already drew (one child each): a polybasic level's block, whose tokens come out of
    its own verification and are distributed as its q (None where nobody reads q: greedy, unrecorded)."""

    q: torch.Tensor | None
    ids: list[int]


@dataclass(frozen=True)
class Feed:
    """The nodes one draft forward feeds, all one level down the tree: their tokens, the row at which each one's parent
    was fed among the forwards of this draft so far, counting from 0 (−1: the root, the last committed token), and their
    ``depth`` (1: the root's children). The first forward of a draft feeds no node (depth 0): it gives the logits after the
    committed tokens. Tokens and rows are :class:`DeviceToken` where the draft has not read them."""

    ids: list[int]
    rows: list[int]
    depth: int


Expander = Callable[[Feed], "torch.Tensor | Drawn"]
"""``expand(feed)``: the draft's logits (nodes, vocab) after each node the :class:`Feed` feeds, (1, vocab) after the
committed tokens for a feed of no node. A row of −inf: nothing can follow that node. Every drafter drafts through one
(:func:`grow_tree`), which turns logits into the draft's q under the run's sampling transform only where q is read."""

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
    """Whether the tree of these parents has one child per node (parents still on the device: a dynamic tree's, read
    as branching without reading them)."""
    return not any(isinstance(p, DeviceToken) for p in parents) and all(parent == i - 1 for i, parent in enumerate(parents))


def depths(parents: list[int]) -> list[int]:
    """Depth of every node (1 for the root's children)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def ancestry(parents: list[int]) -> torch.Tensor:
    """(n, n) bool: node i sees node j iff j is i or one of its ancestors (the tree attention mask among nodes), on the
    device of parents still there (:class:`DeviceToken`), else on the CPU. Each node's depth is its row's sum."""
    n = len(parents)
    device = next((p.tensor.device for p in parents if isinstance(p, DeviceToken)), torch.device("cpu"))
    up = (ids_tensor(parents, device)[:, None] == torch.arange(n, device=device)).float()  # node → its parent
    seen = up + torch.eye(n, device=device)
    for _ in range(max(n - 1, 1).bit_length()):  # paths of up to 2^k steps: closed after log2(n) squarings
        seen = (seen @ seen).clamp(max=1)
    return seen.bool()


def tree_rows(parents: list[int], context: int, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """For the nodes from ``first`` on: the slots each sees (nodes, ``context`` + n), the ``context`` slots before the
    tree and its ancestors and itself, and its depth (nodes,); on the device of :func:`ancestry`."""
    seen = ancestry(parents)[first:]
    return torch.cat([seen.new_ones(len(seen), context), seen], 1), seen.sum(-1)


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
    (every row the expander returns holds a token) and no rule reads the draws, a greedy tree's ids stay on the device
    (:class:`DeviceToken`); a dynamic tree's parents too where reads wait (:func:`reads_wait`). Any other tree reads
    each level's draws once."""
    static = shape.kind == "static"
    need_q = keep_q or not sampler.greedy
    unread = finite and not need_q and stop is None
    root = expand(Feed([], [], 0))
    if unread and not static and shape.branch > 1 and isinstance(root, torch.Tensor) and reads_wait(root.device):
        return Grown(_dynamic_on_device(expand, root, shape.branch, nodes, depth), None)
    unread = unread and (static or shape.branch == 1)  # the shape is known ahead
    ids: list[int] = []
    parents: list[int] = []
    keys: list[float] = []  # cumulative key, capped by the parent's and the earlier sibling's (inclusion stays closed)
    qs: list[torch.Tensor | None] = []
    paths: list[list[float]] = []  # with a stop rule: the draft probability of each token on a node's path
    ended: set[int] = set()  # nodes the stop rule gave no children
    fed: dict[int, int] = {}  # node → the row it was fed at

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

    level = add([-1], root, min(shape.branch, nodes))
    for d in range(1, depth):
        growing = [n for n in level if n not in ended]
        if static:
            frontier = growing[: nodes - len(ids)]
        else:
            frontier = sorted(growing, key=lambda n: (-keys[n], n))[: shape.branch]
        if not frontier:
            break
        if not static and len(ids) >= nodes and sorted(keys, reverse=True)[nodes - 1] >= keys[frontier[0]]:
            break  # no deeper node could enter the budget's best
        feed = Feed([ids[n] for n in frontier], [fed.get(parents[n], -1) for n in frontier], d)
        for n in frontier:
            fed[n] = len(fed)
        level = add(frontier, expand(feed), 1 if static else shape.branch)
    keep = sorted(sorted(range(len(ids)), key=lambda n: (-keys[n], n))[: nodes])
    index = {old: new for new, old in enumerate(keep)}
    q = torch.stack([qs[n] for n in keep]) if keep and all(qs[n] is not None for n in keep) else None
    return Grown(TokenTree([ids[n] for n in keep], [index.get(parents[n], -1) for n in keep]), q,
                 [paths[n][-1] for n in keep] if stop is not None else None)


def _dynamic_on_device(expand: Expander, root: torch.Tensor, branch: int, nodes: int, depth: int) -> TokenTree:
    """The greedy dynamic tree :func:`grow_tree` grows, grown without reading the device: each level's frontier (its
    ``branch`` best nodes by cumulative key, ties to the earlier node) is chosen there, and the budget's best nodes are
    kept there, ids and parents (:class:`DeviceToken`). The same tree, numbered alike, as growing it with reads. Growth
    may stop once no deeper node could enter the budget's best; on CUDA that condition is copied to the host as each
    level is drawn, without waiting, and read a level later, while the next level's forward runs, so growth goes at most
    one level past it (stopping later keeps the same nodes). Elsewhere the tree grows to ``depth``."""
    def draw(logits: torch.Tensor, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``branch`` best tokens and their cumulative keys below a node of key ``base``."""
        top = logits.topk(min(branch, logits.shape[-1]))
        x = (top.values.float() - logits.float().logsumexp(-1, keepdim=True)).double()
        return top.indices, torch.minimum(base[:, None], base[:, None] + x).cummin(-1).values

    device = root.device
    ids, keys = draw(root, torch.zeros(1, dtype=torch.double, device=device))
    ids, keys = ids[0, :nodes], keys[0, :nodes]
    parents = torch.full_like(ids, -1)
    first, fed = 0, 0  # the last level's first node; the rows fed so far
    rows: list[int] | torch.Tensor = [-1] * len(ids)  # the row each node of the last level's parent was fed at
    posted = [_posted(_may_stop(keys, first, nodes))]  # after each level: may growth stop? (on the host, later)
    for d in range(1, depth):
        if _holds(posted[-1], wait=False) or (len(posted) > 1 and _holds(posted[-2], wait=True)):
            break
        frontier = torch.sort(-keys[first:], stable=True).indices[:branch]  # indices within the level
        node = first + frontier
        feed_rows = rows[: len(node)] if isinstance(rows, list) else [DeviceToken(r) for r in rows[frontier]]
        logits = expand(Feed([DeviceToken(t) for t in ids[node]], feed_rows, d))
        new_ids, new_keys = draw(logits, keys[node])
        rows = fed + torch.arange(len(node), device=device).repeat_interleave(new_ids.shape[1])
        first, fed = len(ids), fed + len(node)
        ids, keys = torch.cat([ids, new_ids.flatten()]), torch.cat([keys, new_keys.flatten()])
        parents = torch.cat([parents, node.repeat_interleave(new_ids.shape[1])])
        posted.append(_posted(_may_stop(keys, first, nodes)))
    keep = torch.sort(-keys, stable=True).indices[:nodes].sort().values
    index = torch.full_like(parents, -1).index_put_((keep,), torch.arange(len(keep), device=device))
    kept = parents[keep]
    kept = torch.where(kept >= 0, index[kept.clamp(min=0)], -1)
    return TokenTree([DeviceToken(t) for t in ids[keep]], [DeviceToken(p) for p in kept])


def _may_stop(keys: torch.Tensor, first: int, nodes: int) -> torch.Tensor | None:
    """Whether no node below the last level (from ``first``) could enter the ``nodes`` best: none beats the budget's last."""
    return keys.topk(nodes).values[-1] >= keys[first:].max() if len(keys) >= nodes else None


def _posted(condition: torch.Tensor | None) -> tuple[torch.Tensor, torch.cuda.Event] | None:
    """``condition`` on its way to the host, copied without waiting, on CUDA; None elsewhere (or with no condition)."""
    if condition is None or condition.device.type != "cuda":
        return None
    host, copied = condition.to("cpu", non_blocking=True), torch.cuda.Event()
    copied.record()
    return host, copied


def _holds(posted: tuple[torch.Tensor, torch.cuda.Event] | None, wait: bool) -> bool:
    """Whether a :func:`_posted` condition holds: after waiting for its copy, or only if the copy has landed."""
    if posted is None:
        return False
    host, copied = posted
    if not wait and not copied.query():
        return False
    copied.synchronize()  # at once if the copy has landed
    return bool(host.numpy())  # host memory the copy wrote: no device read


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
