"""The cached-model contract: a model with its own KV cache that always mirrors a prefix of the decoded sequence.

:class:`CachedModel` feeds only the tokens its cache lacks and rolls back lazily to the longest common prefix,
so drafters and verifiers pass the full token list and need no bookkeeping. Each forward returns a
:class:`Forward` with what it computed. Where the keys and values live is the storage's business: transformers'
``DynamicCache`` (:class:`DynamicStorage`, any architecture) or the preallocated lean buffer of
``specviz.models.backends.lean``; both take the same calls.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from specviz.core.hidden import capture_prenorm, final_norm


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


def device_sync(device: torch.device):
    """What waits for the device's queued work before a forward is timed (nothing on a CPU)."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


@dataclass(frozen=True)
class Forward:
    """One cached forward: ``logits`` (keep, vocab) of the last ``keep`` fed positions; ``prenorm`` their
    pre-final-norm states (keep, hidden) and ``features`` the final-normed states of every fed position
    (fed, hidden), the first at position ``start``, each when the model was built to return them."""

    logits: torch.Tensor
    start: int
    prenorm: torch.Tensor | None = None
    features: torch.Tensor | None = None


class Storage(Protocol):
    """Where a cached model keeps its keys and values."""

    def run(self, ids: list[int], start: int, keep: int, states: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` at positions ``start``..; logits of the last ``keep`` and, if ``states``, the pre-norm
        states of every fed position. Whatever was cached from ``start`` on is replaced."""
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

    def run(self, ids: list[int], start: int, keep: int, states: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.tensor([ids], device=self.model.device)
        with capture_prenorm(self.model) if states else nullcontext() as slot:
            out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0, -keep:], slot["states"][0] if states else None

    def truncate(self, length: int) -> None:
        cached = self.cache.get_seq_length()
        if length < cached:
            self.cache.crop(length - cached)


class CachedModel:
    """A loaded model, its storage and the token ids the storage holds. Built with ``prenorm`` or ``features``,
    every :class:`Forward` it returns carries those states too (judge decoding reads the first, a feature head
    the second)."""

    def __init__(self, lm: LoadedModel, vocab_size: int | None = None, storage: Storage | None = None,
                 prenorm: bool = False, features: bool = False):
        self.lm, self.name = lm, lm.name
        self.vocab_size = vocab_size or lm.vocab_size
        self.storage = storage or DynamicStorage(lm)
        self.prenorm, self.features = prenorm, features
        self.ids: list[int] = []
        self.forwards = 0
        self.forward_s = 0.0
        self._sync = device_sync(lm.device)

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
        start = time.perf_counter()
        logits, states = self.storage.run(new, n, keep, self.prenorm or self.features)
        result = Forward(logits[:, : self.vocab_size], n, states[-keep:] if self.prenorm else None,
                         final_norm(self.lm.model)(states) if self.features else None)
        self._sync()
        self.forward_s += time.perf_counter() - start
        self.ids.extend(new)
        self.forwards += 1
        return result

    def prefill(self, tokens: list[int]) -> Forward | None:
        """Process everything but the last token (the next forward feeds it with its drafts)."""
        return self.forward(tokens[:-1], keep=1) if len(tokens) > 1 else None
