"""The cached-model contract: a model with its own KV cache that always mirrors a prefix of the decoded sequence.

:class:`CachedModel` feeds only the tokens its cache lacks (drafters pass the full token list) and rolls back by
position: :meth:`CachedModel.rollback` keeps a length, plus the accepted rows of a token tree moved after it, as
gpt-fast moves ``input_pos``; a drafter's forward over tokens that differ from the cached ones rolls back to their
common prefix first. The decoding loop uses the two calls whose preconditions are asserted: :meth:`CachedModel.verify`
(the cache holds every committed token but the last) and :meth:`CachedModel.commit`. Each forward returns a
:class:`Forward` with what it computed; a model built with ``taps`` returns those layers' outputs at every fed row,
which the loop hands to the drafters that read them (:meth:`Forward.kept`); the pre-norm state a judge reads is the
last layer's tap. Where the keys
and values live is the storage's business: transformers' ``DynamicCache`` (:class:`DynamicStorage`, any architecture)
or the preallocated lean buffer of ``specviz.models.backends.lean``; both take the same calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from specviz.core.hidden import last_layer, layer_outputs
from specviz.core.timing import ForwardTimes, Timed
from specviz.core.tree import TokenTree, ids_tensor, tree_rows


class Loaded(Protocol):
    """What a cached model needs of a loaded one (``specviz.models.loaded.LoadedModel``): its display name, the torch
    module, the vocabulary size it may emit and its device."""

    name: str
    model: torch.nn.Module
    vocab_size: int

    @property
    def device(self) -> torch.device: ...


def grown(buffer: torch.Tensor | None, end: int, like: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``buffer`` with room for positions 0..end−1 along ``dim``: itself if it has them, else zeros shaped as ``like`` but
    for ``dim``, which holds max(end, twice what it held, 256) positions, the held ones copied to its start (a cache
    that grows by doubling)."""
    have = 0 if buffer is None else buffer.shape[dim]
    if end <= have:
        return buffer
    shape = list(like.shape)
    shape[dim] = max(end, 2 * have, 256)
    out = like.new_zeros(shape)
    if have:
        out.narrow(dim, 0, have).copy_(buffer)
    return out


@dataclass(frozen=True)
class Forward:
    """One cached forward: ``logits`` (keep, vocab) of the last ``keep`` fed positions; ``prenorm`` their
    pre-final-norm states (keep, hidden) and ``layers`` the outputs of the tapped decoder layers (layer index →
    (fed, hidden)) at every fed position, the first at position ``start``, each when the model was built to
    return them."""

    logits: torch.Tensor
    start: int
    prenorm: torch.Tensor | None = None
    layers: dict[int, torch.Tensor] | None = None

    def kept(self, first: int, path: list[int]) -> dict[int, torch.Tensor] | None:
        """The tapped states of the slots a commit keeps from slot ``first`` on: that slot (a verify's root), then the
        nodes on ``path`` (node i was fed at slot first + 1 + i)."""
        if not self.layers:
            return None
        rows = torch.tensor([first - self.start] + [first + 1 + i - self.start for i in path])
        return {i: h[rows.to(h.device)] for i, h in self.layers.items()}


@dataclass(frozen=True)
class TreeRows:
    """Fed rows that hold a token tree: the rotary position of each (t,) and the slots each attends to (t, start + t),
    the fed rows' own slots included (a tree attention mask)."""

    positions: torch.Tensor
    visible: torch.Tensor


class Storage(Protocol):
    """Where a cached model keeps its keys and values, one slot per fed row."""

    def run(self, ids: list[int], start: int, keep: int, taps: tuple[int, ...],
            rows: TreeRows | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Feed ``ids`` into slots ``start``.. (at those positions, causally, unless ``rows`` says otherwise); logits of
        the last ``keep`` and the outputs of the decoder layers in ``taps`` at every fed row. Whatever was cached from
        ``start`` on is replaced."""
        ...

    def truncate(self, length: int, moved: list[int] | tuple[int, ...] = ()) -> None:
        """Keep the slots before ``length``, then the slots ``moved`` in that order; forget the rest."""
        ...


class DynamicStorage:
    """transformers' own forward over a ``DynamicCache``: works for any causal LM."""

    def __init__(self, lm: Loaded):
        from transformers import DynamicCache

        self.model = lm.model
        self.cache = DynamicCache(config=lm.model.config)

    def run(self, ids: list[int], start: int, keep: int, taps: tuple[int, ...],
            rows: TreeRows | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        x = ids_tensor(ids, self.model.device)[None]
        tree = {} if rows is None else {"position_ids": rows.positions[None].to(x.device), "attention_mask": self._mask(rows.visible)}
        out, outputs = layer_outputs(self.model, taps, input_ids=x, past_key_values=self.cache, use_cache=True,
                                     logits_to_keep=keep, **tree)
        return out.logits[0, -keep:], {i: h[0] for i, h in outputs.items()}

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """A custom 4D mask (transformers passes one through as it is): 0 where a row attends, the dtype's minimum elsewhere."""
        dtype = self.model.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.model.device)
        return mask.masked_fill(~visible.to(mask.device), torch.finfo(dtype).min)[None, None]

    def truncate(self, length: int, moved: list[int] | tuple[int, ...] = ()) -> None:
        cached = self.cache.get_seq_length()
        if moved:
            device = self.model.device
            index = torch.cat([torch.arange(length, device=device), torch.tensor(list(moved), device=device)])
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys.index_select(-2, index), layer.values.index_select(-2, index)
        elif length < cached:
            self.cache.crop(length - cached)


class CachedModel(Timed):
    """A loaded model, its storage and the token ids the storage holds. Built with ``taps`` (decoder layer indices),
    every :class:`Forward` it returns carries those layers' outputs too (a feature head reads them); with the last
    layer among them, its ``prenorm`` too (judge decoding reads it). ``pace``, if given, is told each CPU forward's model
    name, fed rows and seconds (the CPU backend chooses its thread count by them)."""

    def __init__(self, lm: Loaded, vocab_size: int | None = None, storage: Storage | None = None,
                 taps: tuple[int, ...] = (), pace: Callable[[str, int, float], None] | None = None):
        self.lm, self.name = lm, lm.name
        self.vocab_size = vocab_size or lm.vocab_size
        self.storage = storage or DynamicStorage(lm)
        self.taps = tuple(sorted(set(taps)))
        self.ids: list[int] = []  # the token in each cached slot
        self.linear = 0  # the leading slots that hold a plain sequence; the slots after them hold a token tree
        self.tree_parents: list[int] = []  # that tree's parents (see specviz.core.tree)
        self.times, self.pace = ForwardTimes(lm.device), pace

    @property
    def prenorm(self) -> bool:
        """Whether its forwards return the pre-norm states: the last decoder layer is a tap."""
        return last_layer(self.lm.model) in self.taps

    def _common_prefix(self, tokens: list[int]) -> int:
        ids = self.ids[: self.linear]
        n = min(len(ids), len(tokens))
        if ids[:n] == tokens[:n]:
            return n
        return next(i for i, (a, b) in enumerate(zip(ids, tokens)) if a != b)

    def _cached_tree(self, tokens: list[int], tree: TokenTree) -> int:
        """How many leading nodes of ``tree`` below ``tokens`` the cache already holds."""
        have = len(self.ids) - self.linear
        if self.linear != len(tokens) or self._common_prefix(tokens) != len(tokens) or have > len(tree.ids):
            return 0
        return have if self.ids[self.linear:] == tree.ids[:have] and self.tree_parents == tree.parents[:have] else 0

    @torch.inference_mode()
    def rollback(self, length: int, moved: list[int] | tuple[int, ...] = ()) -> None:
        """Keep the first ``length`` slots, then the slots ``moved`` (the accepted path of a tree, root down) after them."""
        if list(moved) == list(range(length, length + len(moved))):  # a single path's accepted drafts are where they stay
            length, moved = length + len(moved), ()
        self.storage.truncate(length, moved)
        self.ids = self.ids[:length] + [self.ids[s] for s in moved]
        self.linear, self.tree_parents = len(self.ids), []

    @torch.inference_mode()
    def verify(self, tokens: list[int], tree: TokenTree) -> Forward:
        """The decoding loop's forward: the last committed token and the drafted ``tree`` below it, one row each. The
        cache must hold every committed token but the last."""
        assert self.ids == tokens[:-1], "verify expects the cache to hold every committed token but the last"
        return self.forward(tokens, keep=len(tree.ids) + 1, tree=tree)

    @torch.inference_mode()
    def commit(self, length: int, path: list[int]) -> None:
        """After a :meth:`verify` below ``length`` committed tokens: keep them and the nodes on ``path`` (root down)."""
        assert length <= len(self.ids) and all(0 <= node < len(self.ids) - length for node in path), \
            "commit keeps committed tokens and verified nodes only"
        self.rollback(length, [length + node for node in path])

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep: int = 1, tree: TokenTree | None = None) -> Forward:
        """What the model computes for the last ``keep`` fed rows of ``tokens`` and, if given, the token ``tree`` below
        them: each node attends to ``tokens`` and its ancestors, at position len(tokens) − 1 + its depth (see
        :class:`Forward`). A single path is fed as a plain sequence."""
        if tree is not None and tree.is_single_path:
            tokens, tree = tokens + tree.ids, None
        ids, parents = (tree.ids, tree.parents) if tree else ([], [])
        reused = self._cached_tree(tokens, tree) if tree else 0
        n = self._common_prefix(tokens) if not reused else len(tokens)
        n = min(n, len(tokens) - max(0, keep - len(ids) + reused))
        if n < len(tokens):
            reused = 0
        if not reused:
            self.rollback(n)
        new = tokens[n:] + ids[reused:]
        start = self.times.start()
        rows = self._tree_rows(n, len(tokens), parents, reused) if tree else None
        logits, outputs = self.storage.run(new, n + reused, keep, self.taps, rows)
        result = Forward(logits[:, : self.vocab_size], n + reused, outputs[last_layer(self.lm.model)][-keep:] if self.prenorm else None,
                         outputs or None)
        seconds = self.times.stop(start)
        if self.pace is not None and seconds is not None:
            self.pace(self.name, len(new), seconds)
        self.ids = tokens + ids if tree else tokens[:]
        self.linear, self.tree_parents = len(tokens), list(parents)
        return result

    def _tree_rows(self, start: int, length: int, parents: list[int], reused: int) -> TreeRows:
        """Positions and attention of the rows fed from slot ``start``: the tokens up to ``length``, then the tree's nodes
        from ``reused`` on."""
        tree, depth = tree_rows(parents, length, reused)
        slots = torch.arange(start, length, device=tree.device)
        linear = torch.arange(length + len(parents), device=tree.device)[None] <= slots[:, None]
        return TreeRows(torch.cat([slots, length - 1 + depth]), torch.cat([linear, tree]))

    def prefill(self, tokens: list[int]) -> Forward | None:
        """Process everything but the last token (the next forward feeds it with its drafts)."""
        return self.forward(tokens[:-1], keep=1) if len(tokens) > 1 else None
