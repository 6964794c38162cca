"""Drafters: propose up to γ next tokens and the distributions q they were drawn from.

The contract follows transformers' ``CandidateGenerator``: :meth:`Drafter.draft` gets the full committed sequence
(drafters roll their own state back to it) and the step's size, and returns a :class:`Draft`, a token tree
(:mod:`specviz.core.tree`). Under the run's :class:`~specviz.core.tree.TreeShape` it is grown from the distributions
the drafter's ``expander`` gives after any node; under :data:`SINGLE_PATH` (a single path is the tree whose every node has one
child) ``propose`` drafts it token by token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specviz.core.cache import CachedModel
from specviz.core.registry import DRAFTERS
from specviz.core.sampling import Sampler
from specviz.core.timing import Mark, Stopwatch, Timed
from specviz.core.tree import MAX_TREE_NODES, Expander, TokenTree, TreeShape, grow_tree

StopRule = Callable[[torch.Tensor], bool]
"""Called with the draft's distribution for the next token; True stops drafting before that token."""

SINGLE_PATH = TreeShape(1, "single-path")
"""The shape of a single-path tree: one child per node, as deep as it has nodes."""


def step_size(shape: TreeShape, size: int, room: int) -> tuple[int, int]:
    """A step's node count and depth for a policy's ``size`` with ``room`` tokens left before the token limit (the
    target adds one more): a single path's length is its depth; a tree's budget is capped by what a cache keeps free for it."""
    if room <= 0:
        return 0, 0
    return (min(size, room),) * 2 if shape == SINGLE_PATH else (min(size, MAX_TREE_NODES), min(size, room))


@dataclass
class LevelWork:
    """One level's work in one proposal, as measured: forwards (or lookups), the stopwatch spans it ran (read by the
    recorder once the step is done, so measuring never waits on the device) and, for a verifying level of a polybasic
    chain, one [drafted, passed up] pair per verification and the token ids of each (``blocks``: drafted, passed)."""

    name: str
    role: str
    watch: Stopwatch
    passes: int = 0
    spans: list[tuple[Mark, Mark]] = field(default_factory=list)
    verifications: list[list[int]] = field(default_factory=list)
    blocks: list[dict] = field(default_factory=list)

    def merge(self, other: LevelWork) -> None:
        """Add another proposal's work at the same level."""
        self.passes += other.passes
        self.spans += other.spans
        self.verifications += other.verifications
        self.blocks += other.blocks


@dataclass
class Draft:
    """A drafted token tree: its node ids and ``parents`` (a single path's when not given); ``q`` (nodes, vocab) holds the
    distribution each was drawn from, None for a deterministic proposal (q is one-hot at the proposed id); ``levels``:
    each level's work for it, top first (one level for a single drafter, one per level of a polybasic chain)."""

    ids: list[int]
    q: torch.Tensor | None
    drafter: str
    levels: list[LevelWork] = field(default_factory=list)
    parents: list[int] = None  # type: ignore[assignment]  # a single path's, filled in below

    def __post_init__(self) -> None:
        if self.parents is None:
            self.parents = TokenTree.single_path(self.ids).parents

    @property
    def tree(self) -> TokenTree:
        return TokenTree(self.ids, self.parents)

    def q_of_ids(self) -> list[float]:
        if self.q is None:
            return [1.0] * len(self.ids)
        rows = torch.arange(len(self.ids), device=self.q.device)
        return self.q[rows, torch.tensor(self.ids, dtype=torch.long, device=self.q.device)].tolist()


class Drafter:
    """Base class: a named source of draft tokens with a per-token cost the policies can learn.

    A drafter kind registers in :data:`~specviz.core.registry.DRAFTERS`; the run builds it with ``from_source(name,
    source, context)`` (context: ``specviz.runtime.prepare.DraftContext``) for a source it ``claims``. A kind that
    ``loads_model`` gets its model loaded first; one that ``reads_features`` makes the target keep the outputs of
    the decoder layers its ``reads_layers`` names. ``models``: what it times (the engine sums their forward time)."""

    name = "drafter"
    models: list[Timed] = []
    loads_model = False
    reads_features = False

    @classmethod
    def claims(cls, source: object) -> bool:
        """Whether a draft source (a name, path or hub id; or a loaded model) is of this kind."""
        return False

    @classmethod
    def reads_layers(cls, source: object, n_layers: int) -> tuple[int, ...]:
        """The target's decoder layers whose outputs this kind reads from every target forward (for a target of
        ``n_layers``)."""
        return ()

    def draft(self, tokens: list[int], nodes: int, depth: int, shape: TreeShape, sampler: Sampler,
              stop: StopRule | None = None) -> Draft:
        """The step's draft below ``tokens``: at most ``nodes`` nodes in ``depth`` levels grown as ``shape`` says
        (:func:`step_size`); ``stop`` may end a single path early."""
        if nodes == 0:
            return Draft([], None, self.name)
        if shape == SINGLE_PATH:
            return self.propose(tokens, nodes, sampler, stop)
        return self.propose_tree(tokens, shape, nodes, depth, sampler)

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        """A single path of up to ``gamma`` tokens drafted one after the other."""
        raise NotImplementedError

    def expander(self, tokens: list[int], sampler: Sampler) -> Expander:
        """The draft's distributions after the nodes of a tree below ``tokens`` (see :data:`specviz.core.tree.Expander`)."""
        raise NotImplementedError(f"the {self.name} drafter does not draft trees")

    def propose_tree(self, tokens: list[int], shape: TreeShape, nodes: int, depth: int, sampler: Sampler) -> Draft:
        """A token tree of ``shape`` below ``tokens`` (at most ``nodes`` nodes, ``depth`` levels): one node per id, with
        its parent and the q it was drawn from."""
        started = self._started()
        tree, q = grow_tree(self.expander(tokens, sampler), shape, nodes, depth, sampler)
        return Draft(tree.ids, q, self.name, [self._work(*started)], tree.parents)

    def _watch(self) -> Stopwatch:
        """The stopwatch of this drafter's device (a model-free drafter times on the CPU)."""
        return self.models[0].times.watch if self.models else Stopwatch(torch.device("cpu"))

    def _started(self) -> tuple[Stopwatch, Mark, int]:
        """The stopwatch, a mark and the forwards so far: the start of a proposal's work."""
        watch = self._watch()
        return watch, watch.mark(), sum(m.forwards for m in self.models)

    def _work(self, watch: Stopwatch, start: Mark, forwards: int) -> LevelWork:
        """The work of a proposal :meth:`_started` began."""
        passes = sum(m.forwards for m in self.models) - forwards or 1  # a model-free drafter: one lookup pass
        return LevelWork(self.name, "draft", watch, passes, [(start, watch.mark())])

    def _chain(self, next_logits: Callable[[list[int]], torch.Tensor | None], gamma: int, sampler: Sampler,
               stop: StopRule | None) -> Draft:
        """A single path drawn one token at a time: ``next_logits(ids)`` gives the draft's logits after the ids drawn so far
        (None: it cannot go on)."""
        started, ids, qs = self._started(), [], []
        while len(ids) < gamma and (logits := next_logits(ids)) is not None:
            q = sampler.probs(logits)
            if stop is not None and stop(q):
                break
            ids.append(int(sampler.pick(logits, q)))
            qs.append(q)
        return Draft(ids, torch.stack(qs) if qs else None, self.name, [self._work(*started)])

    def prefill(self, tokens: list[int]) -> None:
        """Process the prompt ahead of the first step (nothing to do for model-free drafters)."""

    def can_draft(self, tokens: list[int]) -> bool:
        """Whether ``propose`` would return any token after ``tokens`` (a model always can)."""
        return True

    def blank_levels(self) -> list[LevelWork]:
        """Empty per-level work, top first, in the shape ``propose`` reports it."""
        return [LevelWork(self.name, "draft", self._watch())]


@DRAFTERS.register("A small causal LM sharing the target's tokenizer, drafting token by token.", ("full_draft_vocab",), name="model")
class ModelDrafter(Drafter):
    """Drafts autoregressively with a small causal LM that shares the target's token ids."""

    loads_model = True

    def __init__(self, model: CachedModel):
        self.model = model
        self.models = [model]
        self.name = model.name

    @classmethod
    def claims(cls, source: object) -> bool:
        return True  # any hub id, directory or loaded model; more specific kinds are asked first

    @classmethod
    def from_source(cls, name: str, source: object, context) -> ModelDrafter:
        return cls(context.draft_model(name))

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        return self._chain(lambda ids: self.model.forward(tokens + ids, keep=1).logits[0], gamma, sampler, stop)

    def expander(self, tokens: list[int], sampler: Sampler) -> Expander:
        fed_ids: list[int] = []
        fed_parents: list[int] = []
        slot: dict[int, int] = {}  # tree node → its row among the fed ones

        def expand(ids: list[int], parents: list[int], new: list[int]) -> torch.Tensor:
            for node in new:
                slot[node] = len(fed_ids)
                fed_ids.append(ids[node])
                fed_parents.append(slot[parents[node]] if parents[node] >= 0 else -1)
            fed = TokenTree(fed_ids, fed_parents) if new else None
            logits = self.model.forward(tokens, keep=max(1, len(new)), tree=fed).logits
            return sampler.probs(logits)
        return expand

    def prefill(self, tokens: list[int]) -> None:
        self.model.prefill(tokens)


@DRAFTERS.register("Prompt lookup: continue the latest earlier occurrence of the current suffix (no model).")
class NGramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the current suffix (longest n first) and
    propose the tokens that followed it. Needs no model; q is one-hot."""

    name = "ngram"

    @classmethod
    def claims(cls, source: object) -> bool:
        return source == cls.name

    @classmethod
    def from_source(cls, name: str, source: object, context) -> NGramDrafter:
        return cls()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: list[int], gamma: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        started = self._started()
        ids = lookup_continuation(tokens, gamma, self.max_ngram, self.min_ngram)
        return Draft(ids, None, self.name, [self._work(*started)])

    def can_draft(self, tokens: list[int]) -> bool:
        return bool(lookup_continuation(tokens, 1, self.max_ngram, self.min_ngram))

    def expander(self, tokens: list[int], sampler: Sampler) -> Expander:
        vocab = max(tokens) + 1

        def expand(ids: list[int], parents: list[int], new: list[int]) -> torch.Tensor:
            return torch.stack([next_token_counts(tokens + path_to(ids, parents, node), vocab, self.max_ngram, self.min_ngram)
                                for node in new or [-1]])
        return expand


def path_to(ids: list[int], parents: list[int], node: int) -> list[int]:
    """The tokens from the root down to ``node`` (none for −1, the root)."""
    path = []
    while node >= 0:
        path.append(ids[node])
        node = parents[node]
    return path[::-1]


def next_token_counts(tokens: list[int], vocab: int, max_ngram: int, min_ngram: int = 1) -> torch.Tensor:
    """The n-gram draft's q after ``tokens``: how often each token followed the earlier occurrences of the longest
    suffix that occurred before (≤ ``max_ngram`` tokens), normalised; all zeros where no suffix did."""
    counts = torch.zeros(vocab)
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == suffix:
                counts[tokens[start + n]] += 1
        if counts.any():
            return counts / counts.sum()
    return counts


def lookup_continuation(tokens: list[int], gamma: int, max_ngram: int, min_ngram: int = 1) -> list[int]:
    """Continuation of the most recent earlier match of the longest matching suffix (≤ γ tokens)."""
    if gamma <= 0:
        return []
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + gamma]
    return []
