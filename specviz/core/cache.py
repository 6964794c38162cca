"""A model with its own KV cache that always mirrors a prefix of the decoded sequence."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from specviz.core.hidden import capture_prenorm


class CachedModel:
    """Feeds only the tokens its cache lacks; rolls the cache back to the longest common prefix.

    Rolling back lazily, at the next forward, keeps every drafter and verifier free of bookkeeping:
    they pass the full token list and get logits for its last ``keep`` positions.
    """

    def __init__(self, lm: LoadedModel, vocab_size: int | None = None):
        self.lm = lm
        self.name = lm.name
        self.vocab_size = vocab_size or lm.vocab_size
        self.ids: list[int] = []
        self.forwards = 0
        self.forward_s = 0.0
        self.prenorm: torch.Tensor | None = None
        self.states: torch.Tensor | None = None
        self.keep_features = False
        self.features: torch.Tensor | None = None
        self._sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
        self._init_cache()

    def _init_cache(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.lm.model.config)

    def _common_prefix(self, tokens: list[int]) -> int:
        n = min(len(self.ids), len(tokens))
        if self.ids[:n] == tokens[:n]:
            return n
        return next(i for i, (a, b) in enumerate(zip(self.ids, tokens)) if a != b)

    def _drop_after(self, n: int) -> None:
        """Forget cached positions from ``n`` on (``n`` < len(self.ids))."""
        self.cache.crop(n - len(self.ids))

    def _run(self, new: list[int], keep: int, capture: bool) -> torch.Tensor:
        """Feed ``new`` after the cached positions; logits (keep, full vocab) of the last ``keep`` positions."""
        ids = torch.tensor([new], device=self.lm.device)
        with capture_prenorm(self.lm.model) if capture else nullcontext() as slot:
            out = self.lm.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.states = slot["states"][0] if capture else None
        return out.logits[0, -keep:]

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep: int = 1, capture: bool = False) -> torch.Tensor:
        """Logits (keep, vocab) for the last ``keep`` positions of ``tokens``; with ``capture``, their
        pre-final-norm hidden states are left in ``self.prenorm`` (keep, hidden). With ``keep_features``,
        ``self.features[i]`` holds the final-normed state at every fed position i (a feature head reads them)."""
        n = min(self._common_prefix(tokens), len(tokens) - keep)
        if n < len(self.ids):
            self._drop_after(n)
            del self.ids[n:]
        new = tokens[n:]
        start = time.perf_counter()
        logits = self._run(new, keep, capture or self.keep_features)
        self.prenorm = self.states[-keep:] if capture else None
        if self.keep_features:
            self._store_features(n, self.lm.model.model.norm(self.states))
        self._sync()
        self.forward_s += time.perf_counter() - start
        self.ids.extend(new)
        self.forwards += 1
        return logits[:, : self.vocab_size]

    def _store_features(self, start: int, normed: torch.Tensor) -> None:
        end, have = start + normed.shape[0], 0 if self.features is None else self.features.shape[0]
        if end > have:
            grown = normed.new_zeros((max(end, 2 * have, 256), normed.shape[1]))
            if have:
                grown[:have] = self.features
            self.features = grown
        self.features[start:end] = normed

    def prefill(self, tokens: list[int]) -> None:
        """Process everything but the last token (the next forward feeds it with its drafts)."""
        if len(tokens) > 1:
            self.forward(tokens[:-1], keep=1)


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
