"""Models, heads and tokenizers loaded once per process and shared read-only between runs and sessions."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from specviz.methods.eagle3 import Eagle3Head, load_eagle3
from specviz.methods.feature_head import FeatureHead, load_head
from specviz.models.loaded import LoadedModel
from specviz.models.loading import load_model, load_tokenizer, pick_device
from specviz.models.presets import Preset, check_access


def target_dtype(setting: str) -> torch.dtype:
    """The target's dtype. ``auto`` is bfloat16 on CUDA and float32 on CPU: a multi-token bf16 verify forward
    rounds differently from the single-token forwards of plain decoding, so near-ties flip and greedy speculative
    decoding stops matching ``generate`` token for token (measured in ``results/bench.md``)."""
    if setting == "auto":
        return torch.bfloat16 if pick_device().type == "cuda" else torch.float32
    return getattr(torch, setting)


class ModelBank:
    """Loads every model and tokenizer once per process and shares them between runs (and sessions:
    runs never share caches, only read-only weights)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()

    def _get(self, kind: str, key: object, load):
        with self._lock:
            if (kind, key) not in self._items:
                self._items[(kind, key)] = load()
            return self._items[(kind, key)]

    def model(self, source: str, name: str, dtype: torch.dtype | None = None) -> LoadedModel:
        """A draft (``dtype`` None: the fastest measured on CPU) or any model in a given dtype."""
        return self._get("model", (source, dtype), lambda: load_model(source, name, dtype=dtype))

    def target(self, preset: Preset, dtype: str = "auto") -> LoadedModel:
        check_access(preset)
        return self.model(preset.target, preset.target_name, target_dtype(dtype))

    def head(self, source: str, target: LoadedModel) -> tuple[FeatureHead, list[int] | None]:
        """A feature head on ``target``'s device and dtype, with its draft vocabulary."""
        return self._get("head", (source, target.dtype), lambda: load_head(Path(source), target.model))

    def eagle3(self, source: str, target: LoadedModel) -> Eagle3Head:
        """A published EAGLE-3 head checked against ``target``, on its device and in its dtype."""
        return self._get("eagle3", (source, id(target.model), target.dtype), lambda: load_eagle3(source, target.model))

    def tokenizer(self, source: str):
        return self._get("tokenizer", source, lambda: load_tokenizer(source))

    def loaded_models(self) -> list[LoadedModel]:
        with self._lock:
            return [m for (kind, _), m in self._items.items() if kind == "model"]
