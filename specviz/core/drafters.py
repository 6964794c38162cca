"""Drafters: propose up to γ next tokens and the distributions q they were drawn from.

The contract follows transformers' ``CandidateGenerator``: :meth:`Drafter.draft` gets the full committed sequence
(drafters roll their own state back to it) and the step's size, and returns a :class:`Draft`, a token tree
(:mod:`specviz.core.tree`). A drafter supplies one thing, its ``expander``: the next-token distributions after a
frontier of nodes. :func:`~specviz.core.tree.grow_tree` grows every shape from it, a single path
(:data:`SINGLE_PATH`) being the tree of branch 1, and a stop rule applies to any shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.core.cache import CachedModel
from specviz.core.registry import DRAFTERS
from specviz.core.sampling import Sampler
from specviz.core.timing import Mark, Stopwatch, Timed
from specviz.core.tree import MAX_TREE_NODES, Expander, Feed, StopRule, TokenTree, TreeShape, grow_tree

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
    distribution each was drawn from (None: a greedy draft nothing records, or a deterministic proposal, read as one-hot
    at the proposed id); ``levels``: the work of each polybasic level for it, top first (one for a single drafter);
    ``confidence``: the draft probability of each node's token where a stop rule read it (else None)."""

    ids: list[int]
    q: torch.Tensor | None
    drafter: str
    levels: list[LevelWork] = field(default_factory=list)
    parents: list[int] = None  # type: ignore[assignment]  # a single path's, filled in below
    confidence: list[float] | None = None

    def __post_init__(self) -> None:
        if self.parents is None:
            self.parents = TokenTree.single_path(self.ids).parents

    @property
    def tree(self) -> TokenTree:
        return TokenTree(self.ids, self.parents)

    def q_over(self, vocab: int, device: torch.device) -> torch.Tensor:
        """q as (nodes, ``vocab``) on ``device``, cut or padded with zeros to the target's vocabulary (a drafter may
        know fewer tokens); one-hot at the ids for a deterministic proposal."""
        if self.q is None:
            q = torch.zeros(len(self.ids), vocab, device=device)
            q[torch.arange(len(self.ids)), torch.tensor(self.ids, device=device)] = 1.0
            return q
        q = self.q.to(device)
        return torch.nn.functional.pad(q, (0, vocab - q.shape[-1])) if q.shape[-1] < vocab else q[:, :vocab]

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
    finite = False  # where it can draft, its logits after any node hold a token (a model's do): greedy drafts stay on the device

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
              stop: StopRule | None = None, keep_q: bool = True) -> Draft:
        """The step's draft below ``tokens``: at most ``nodes`` nodes, at most ``depth`` deep, grown as ``shape`` says
        (:func:`step_size`) from the :meth:`expander`; a node that ``stop`` stops gets no children (:data:`StopRule`).
        Without ``keep_q`` a greedy draft may leave q out (None): nothing reads it where nothing is recorded."""
        if nodes == 0:
            return Draft([], None, self.name)
        started = self._started()
        grown = grow_tree(self.expander(tokens), shape, nodes, depth, sampler, stop, keep_q,
                          self.finite and self.can_draft(tokens))
        return Draft(grown.tree.ids, grown.q, self.name, [self._work(*started)], grown.tree.parents, grown.confidence)

    def expander(self, tokens: list[int]) -> Expander:
        """The draft's logits after the nodes of a tree below ``tokens`` (see :data:`specviz.core.tree.Expander`)."""
        raise NotImplementedError

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

    def prefill(self, tokens: list[int]) -> None:
        """Process the prompt ahead of the first step (nothing to do for model-free drafters)."""

    def read_states(self, first: int, states: dict[int, torch.Tensor]) -> None:
        """The target's tapped decoder-layer outputs (layer → (slots, hidden)) at the committed slots from ``first`` on,
        handed over after the prefill and after every step; only a drafter that ``reads_features`` keeps them."""

    def can_draft(self, tokens: list[int]) -> bool:
        """Whether a draft after ``tokens`` would hold any token (a model always can)."""
        return True

    def blank_levels(self) -> list[LevelWork]:
        """Empty per-level work, top first, in the shape :meth:`draft` reports it."""
        return [LevelWork(self.name, "draft", self._watch())]


@DRAFTERS.register("A small causal LM sharing the target's tokenizer, drafting token by token.", ("full_draft_vocab",), name="model")
class ModelDrafter(Drafter):
    """Drafts autoregressively with a small causal LM that shares the target's token ids."""

    loads_model = True
    finite = True

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

    def expander(self, tokens: list[int]) -> Expander:
        fed_ids: list[int] = []
        fed_parents: list[int] = []  # the rows fed so far, as a tree

        def expand(feed: Feed) -> torch.Tensor:
            fed_ids.extend(feed.ids)
            fed_parents.extend(feed.rows)
            fed = TokenTree(fed_ids, fed_parents) if feed.ids else None
            return self.model.forward(tokens, keep=max(1, len(feed.ids)), tree=fed).logits
        return expand

    def prefill(self, tokens: list[int]) -> None:
        self.model.prefill(tokens)


@DRAFTERS.register("Prompt lookup: continue the current suffix where it occurred before, the latest occurrence first (no model).")
class NGramDrafter(Drafter):
    """Prompt lookup: the draft's q after a node is :func:`followers_q` of the sequence down to it (the longest
    suffix of at most ``max_ngram`` tokens that occurred before; the tokens that followed it, the latest occurrence
    weighing most), so a single path continues the latest match. Needs no model."""

    name = "ngram"

    @classmethod
    def claims(cls, source: object) -> bool:
        return source == cls.name

    @classmethod
    def from_source(cls, name: str, source: object, context) -> NGramDrafter:
        return cls()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def can_draft(self, tokens: list[int]) -> bool:
        return len(followers(torch.tensor(tokens), self.max_ngram, self.min_ngram)) > 0

    def expander(self, tokens: list[int]) -> Expander:
        vocab = max(tokens) + 1
        paths: list[list[int]] = []  # the tokens down to each row fed so far

        def expand(feed: Feed) -> torch.Tensor:
            new = [(paths[row] if row >= 0 else []) + [t] for t, row in zip(feed.ids, feed.rows)]
            paths.extend(new)
            return torch.stack([followers_q(torch.tensor(tokens + path), vocab, self.max_ngram, self.min_ngram)
                                for path in new or [[]]]).log()  # as logits: q is their softmax
        return expand


@DRAFTERS.register("vLLM's n-gram rule: the tokens after the earliest occurrence of the longest suffix (no model).")
class EarliestNGramDrafter(NGramDrafter):
    """vLLM's prompt lookup, as its n-gram proposer drafts: the budget's tokens that followed the *earliest* occurrence
    of the longest suffix of the committed tokens (:func:`ngram_proposal`), in one block. For comparing with a vLLM
    server running ``{"method": "ngram"}``: the same proposal, so the same drafts. Its q is one-hot."""

    name = "ngram-earliest"

    def can_draft(self, tokens: list[int]) -> bool:
        return bool(ngram_proposal(tokens, self.min_ngram, self.max_ngram, 1))

    def expander(self, tokens: list[int]) -> Expander:
        block, vocab = ngram_proposal(tokens, self.min_ngram, self.max_ngram, len(tokens)), max(tokens) + 1

        def expand(feed: Feed) -> torch.Tensor:
            rows = torch.full((len(feed.ids) or 1, vocab), -torch.inf)
            if feed.depth < len(block):  # every node fed is that deep: the block's next token follows each
                rows[:, block[feed.depth]] = 0.0
            return rows
        return expand


def followers(seq: torch.Tensor, max_ngram: int, min_ngram: int = 1) -> torch.Tensor:
    """The tokens that followed the earlier occurrences of the longest suffix of ``seq`` (≤ ``max_ngram`` tokens) that
    occurred before, oldest first; none where no suffix of ``min_ngram`` tokens or more did."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        hits = (seq[:-1].unfold(0, n, 1) == seq[-n:]).all(1).nonzero()[:, 0]
        if len(hits):
            return seq[hits + n]
    return seq[:0]


def followers_q(seq: torch.Tensor, vocab: int, max_ngram: int, min_ngram: int = 1) -> torch.Tensor:
    """The n-gram draft's q after ``seq``: the :func:`followers` of its suffix, each occurrence weighing twice the one
    before it (so the latest occurrence's token is the likeliest), normalised; all zeros where none occurred."""
    after = followers(seq, max_ngram, min_ngram)
    weights = torch.pow(2.0, torch.arange(len(after), dtype=torch.float64) - len(after) + 1)
    q = torch.zeros(vocab, dtype=torch.float64).index_add_(0, after, weights)
    return (q / q.sum() if len(after) else q).float()


def ngram_proposal(tokens: list[int], low: int, high: int, k: int) -> list[int]:
    """vLLM's n-gram proposal after ``tokens``: the tokens that followed the earliest of the longest earlier matches of
    the current suffix (``low`` to ``high`` tokens), at most ``k``; none without a match."""
    best, start, last = 0, 0, len(tokens) - 1
    for end in range(last - 1, -1, -1):  # latest first: a tie keeps the earliest
        n = 0
        while n < high and end - n >= 0 and tokens[end - n] == tokens[last - n]:
            n += 1
        if n and n >= best:
            best, start = n, end + 1
    return tokens[start:start + k] if best >= low else []
