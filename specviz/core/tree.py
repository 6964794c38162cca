"""Token trees: a drafter proposes several continuations at once and the target scores every node in one forward.

Nodes are listed in the order they were drawn: parents before children, siblings in draw order; ``parents[i]`` is
the index of node i's parent, −1 for a child of the last committed token (the root). Row 0 of the target's verify
forward is the root, row i + 1 is node i.

Children are drawn *without replacement* from the draft's q: the top-k at T = 0, Gumbel-top-k at T > 0. Node i
carries the distribution it was drawn from (``Tree.q[i]``): its parent's q without the siblings drawn before it,
renormalised. Verification walks down from the root. Greedy: move to the child equal to the target's argmax.
Sampling (recursive rejection, as in SpecInfer): accept child c with probability min(1, p(c)/q(c)); on a rejection
p ← norm(max(p − q, 0)) and the next sibling is tried with its own q; when every child is rejected the token is
drawn from the last p. Each node's inclusion is decided from draw keys that say nothing of its own token (the
Gumbel maximum is independent of its argmax), so the output is distributed exactly as the target's.

Dynamic trees follow EAGLE-2: expand the ``branch`` nodes of the last level with the highest cumulative key, give
each ``branch`` children, and keep the budget's best nodes. Static trees are ``branch`` chains from the root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.core.sampling import Sampler, residual

TREE_KINDS = ("dynamic", "static")
MAX_TREE_NODES = 64
"""The largest node budget of a step (a cache with static shapes keeps this many slots free for the tree)."""

Expander = Callable[[list[int], list[int], list[int]], torch.Tensor]
"""``expand(ids, parents, new)``: the draft's q (len(new), vocab) after each node in ``new`` of the tree (ids, parents)
so far; with ``new`` empty, the q (1, vocab) after the committed tokens. A node is expanded after its parent."""


@dataclass(frozen=True)
class TreeShape:
    """A step's tree: at most ``nodes`` nodes and ``depth`` levels, ``branch`` children per expanded node."""

    nodes: int
    branch: int
    kind: str
    depth: int


@dataclass
class Tree:
    ids: list[int]
    parents: list[int]
    q: torch.Tensor  # (nodes, vocab): the distribution each node was drawn from


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
class TreeVerdict:
    """The accepted path (node indices, root down), the target's token after it and one record per node."""

    path: list[int]
    next_token: int
    nodes: list[NodeRecord]


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


def children(q: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], list[float], torch.Tensor]:
    """Up to ``k`` distinct tokens drawn without replacement from ``q`` (top-k when greedy, Gumbel-top-k otherwise):
    their ids, their draw keys (log q, plus the Gumbel noise when sampling; decreasing) and the distribution each was
    drawn from (q without the tokens drawn before it, renormalised)."""
    q = q.float()
    n = min(k, int((q > 0).sum()))
    if sampler.greedy:
        top = q.topk(n)
    else:  # q / E with E ~ Exp(1) orders the tokens as log q + Gumbel noise does, with no log over the vocabulary
        noise = torch.empty(q.shape, device=sampler.generator.device).exponential_(generator=sampler.generator)
        top = (q / noise.to(q.device)).topk(n)
    ids = top.indices.tolist()
    stages = q.expand(len(ids), -1).clone()
    for j in range(1, len(ids)):
        stages[j:, ids[j - 1]] = 0
    return ids, top.values.log().tolist(), stages / stages.sum(-1, keepdim=True)


def grow_tree(expand: Expander, shape: TreeShape, sampler: Sampler) -> Tree:
    """The tree of ``shape`` drawn from the draft's distributions (:data:`Expander`)."""
    ids: list[int] = []
    parents: list[int] = []
    keys: list[float] = []  # cumulative key, capped by the parent's and the earlier sibling's (inclusion stays closed)
    qs: list[torch.Tensor] = []

    def add(parent: int, q: torch.Tensor, k: int) -> list[int]:
        drawn, key, stages = children(q, k, sampler)
        cap = keys[parent] if parent >= 0 else 0.0
        for token, x, stage in zip(drawn, key, stages):
            cap = min(cap, (keys[parent] if parent >= 0 else 0.0) + x)
            ids.append(token)
            parents.append(parent)
            keys.append(cap)
            qs.append(stage)
        return list(range(len(ids) - len(drawn), len(ids)))

    static = shape.kind == "static"
    width = min(shape.branch, shape.nodes)
    level = add(-1, expand([], [], [])[0], width)
    for _ in range(shape.depth - 1):
        if static:
            frontier = level[: shape.nodes - len(ids)]
        else:
            frontier = sorted(level, key=lambda n: (-keys[n], n))[: shape.branch]
            if len(ids) >= shape.nodes and sorted(keys, reverse=True)[shape.nodes - 1] >= keys[frontier[0]]:
                break  # no deeper node could enter the budget's best
        if not frontier:
            break
        q = expand(ids, parents, frontier)
        level = [n for node, row in zip(frontier, q) for n in add(node, row, 1 if static else shape.branch)]
    keep = sorted(sorted(range(len(ids)), key=lambda n: (-keys[n], n))[: shape.nodes])
    index = {old: new for new, old in enumerate(keep)}
    return Tree([ids[n] for n in keep], [index.get(parents[n], -1) for n in keep],
                torch.stack([qs[n] for n in keep]) if keep else torch.zeros(0, 0))


def verify_tree(ids: list[int], parents: list[int], q: torch.Tensor, logits: torch.Tensor, p: torch.Tensor,
                sampler: Sampler) -> TreeVerdict:
    """Verify a tree against the target's ``logits`` and ``p`` (rows: root, then each node)."""
    kids: list[list[int]] = [[] for _ in range(len(ids) + 1)]
    for i, parent in enumerate(parents):
        kids[parent + 1].append(i)
    deep = depths(parents)
    q = q.to(p.device)
    q = torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1])) if q.shape[-1] < p.shape[-1] else q[:, : p.shape[-1]]
    qx = q[torch.arange(len(ids), device=q.device), torch.tensor(ids, dtype=torch.long, device=q.device)].tolist()
    records = [NodeRecord(t, parent, d, None, x, None, None) for t, parent, d, x in zip(ids, parents, deep, qx)]
    path, row = [], 0
    best = logits.argmax(-1).tolist() if sampler.greedy else None
    while True:
        target, chosen = p[row], None
        for c in kids[row]:
            rec = records[c]
            rec.p = float(target[ids[c]])
            if best is not None:
                rec.accepted = ids[c] == best[row]
            else:
                rec.u = float(sampler.uniform(1, p.device)[0])
                rec.accepted = rec.u * rec.q < rec.p
                if not rec.accepted:
                    target = residual(target, q[c])
            if rec.accepted:
                chosen = c
                break
        if chosen is None:
            nxt = best[row] if best is not None else int(sampler.draw(target))
            return TreeVerdict(path, nxt, records)
        path.append(chosen)
        row = chosen + 1
