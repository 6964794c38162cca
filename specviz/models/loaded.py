"""A loaded causal LM: the type every loader returns and every run holds."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
