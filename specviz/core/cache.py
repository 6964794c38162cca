"""The cached-model contract: a model with its own KV cache that always mirrors a prefix of the decoded sequence.

:class:`CachedModel` feeds only the tokens its cache lacks and rolls back lazily to the longest common prefix,
so drafters and verifiers pass the full token list and need no bookkeeping. Each forward returns a
:class:`Forward` with what it computed. Where the keys and values live is the storage's business: transformers'
``DynamicCache`` (:class:`DynamicStorage`, any architecture) or the preallocated lean buffer of
``specviz.models.backends.lean``; both take the same calls.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from specviz.core.hidden import capture_layers, last_layer
from specviz.core.timing import ForwardTimes, Timed


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with its display name and the vocabulary size it may emit;
    ``draft_vocab`` (from ``draft_vocab.json`` beside the weights) lists the ids a lean draft head scores."""

    name: str
    model: torch.nn.Module
    vocab_size: int
    draft_vocab: list[int] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


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


class Storage(Protocol):
    """Where a cached model keeps its keys and values."""

    def run(self, ids: list[int], start: int, keep: int, taps: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Feed ``ids`` at positions ``start``..; logits of the last ``keep`` and the outputs of the decoder layers
        in ``taps`` at every fed position. Whatever was cached from ``start`` on is replaced."""
        ...

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        ...


class DynamicStorage:
    """transformers' own forward over a ``DynamicCache``: works for any causal LM."""

    def __init__(self, lm: LoadedModel):
        from transformers import DynamicCache

        self.model = lm.model
        self.cache = DynamicCache(config=lm.model.config)

    def run(self, ids: list[int], start: int, keep: int, taps: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        x = torch.tensor([ids], device=self.model.device)
        with capture_layers(self.model, taps) if taps else nullcontext({}) as outputs:
            out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0, -keep:], {i: h[0] for i, h in outputs.items()}

    def truncate(self, length: int) -> None:
        cached = self.cache.get_seq_length()
        if length < cached:
            self.cache.crop(length - cached)


class CachedModel(Timed):
    """A loaded model, its storage and the token ids the storage holds. Built with ``prenorm`` or ``taps`` (decoder
    layer indices), every :class:`Forward` it returns carries those states too (judge decoding reads the first, a
    feature head the second)."""

    def __init__(self, lm: LoadedModel, vocab_size: int | None = None, storage: Storage | None = None,
                 prenorm: bool = False, taps: tuple[int, ...] = ()):
        self.lm, self.name = lm, lm.name
        self.vocab_size = vocab_size or lm.vocab_size
        self.storage = storage or DynamicStorage(lm)
        self.prenorm, self.taps = prenorm, tuple(sorted(set(taps)))
        self._reads = tuple(sorted(set(self.taps) | ({last_layer(lm.model)} if prenorm else set())))
        self.ids: list[int] = []
        self.times = ForwardTimes(lm.device)

    def _common_prefix(self, tokens: list[int]) -> int:
        n = min(len(self.ids), len(tokens))
        if self.ids[:n] == tokens[:n]:
            return n
        return next(i for i, (a, b) in enumerate(zip(self.ids, tokens)) if a != b)

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep: int = 1) -> Forward:
        """What the model computes for the last ``keep`` positions of ``tokens`` (see :class:`Forward`)."""
        n = min(self._common_prefix(tokens), len(tokens) - keep)
        if n < len(self.ids):
            self.storage.truncate(n)
            del self.ids[n:]
        new = tokens[n:]
        start = self.times.start()
        logits, outputs = self.storage.run(new, n, keep, self._reads)
        result = Forward(logits[:, : self.vocab_size], n, outputs[last_layer(self.lm.model)][-keep:] if self.prenorm else None,
                         {i: outputs[i] for i in self.taps} if self.taps else None)
        self.times.stop(start)
        self.ids.extend(new)
        return result

    def prefill(self, tokens: list[int]) -> Forward | None:
        """Process everything but the last token (the next forward feeds it with its drafts)."""
        return self.forward(tokens[:-1], keep=1) if len(tokens) > 1 else None
