"""The process-wide model bank (the only state the app shares between sessions: read-only weights) and
the model-loading status shown at the top of the page.

Models load once per process: in the background at start-up (the offline preset) or at a session's
first run of another preset. Runs themselves are never shared; they live in each session's ``gr.State``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from specviz.core.env import env
from specviz.methods.feature_head import is_feature_head
from specviz.models.loading import describe_run_machine
from specviz.models.presets import MODEL_FREE_DRAFTS, NGRAM_DRAFT, OFFLINE_PRESET, PRESETS, resolve_preset
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import drafter_kind, run_drafts, run_preset
from specviz.ui.stream import on_model_thread

LOADING_MESSAGE = "Loading models… (the first start converts the GGUF target, ~30 s; later starts take a few seconds)"


class Models:
    """A ModelBank plus what has been loaded so far, so the UI can say when a run will wait for loading."""

    def __init__(self, bank: ModelBank | None = None):
        self.bank = bank or ModelBank()
        self._loaded: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None
        self.error: str | None = None
        self.ready_s: float | None = None

    def is_loaded(self, config: DecodeConfig) -> bool:
        drafts = [d for d in draft_names(config) if d not in MODEL_FREE_DRAFTS]
        with self._lock:
            return (config.preset, "") in self._loaded and all((config.preset, d) in self._loaded for d in drafts)

    def load_weights(self, config: DecodeConfig) -> None:
        """Load the weights a run of ``config`` needs into the shared bank, in this process and computing nothing: on
        ZeroGPU the decodes run in GPU workers forked from this process, which find them there. The loading runs on
        the model thread (see :mod:`specviz.ui.stream`)."""
        on_model_thread(self._load_weights, config)

    def _load_weights(self, config: DecodeConfig) -> None:
        preset = resolve_preset(config.preset)
        target = self.bank.target(preset, config.dtype)
        for name, source in run_drafts(config, preset):
            kind = drafter_kind(source)
            if kind.loads_model:
                self.bank.model(source, name)
            elif kind.reads_features:
                kind.preload(source, self.bank, target)
        self.mark_loaded(config)

    def machine(self, config: DecodeConfig) -> str:
        """What a run of ``config`` runs on: the hardware and, on a CPU, its target's linear kernel per row count."""
        return describe_run_machine(self.bank.target(run_preset(config), config.dtype).model)

    def mark_loaded(self, config: DecodeConfig) -> None:
        with self._lock:
            self._loaded.add((config.preset, ""))
            self._loaded.update((config.preset, d) for d in draft_names(config))

    def warm_up(self, decode: Callable[[dict, str], Iterable], preset: str = OFFLINE_PRESET, background: bool = True) -> None:
        """Load the preset's target and every draft whose weights exist here, and run two tokens through each with
        ``decode`` (the app's decode, which runs where the device is)."""
        if self._warming is not None:
            return
        self._warming = threading.Thread(target=self._warm, args=(decode, preset), name="specviz-warmup", daemon=True)
        self._warming.start()
        if not background:
            self._warming.join()

    def _warm(self, decode: Callable[[DecodeConfig, str], Iterable], preset: str) -> None:
        start = time.perf_counter()
        try:
            for config in warmup_configs(preset):
                self.load_weights(config)
                for _ in decode(config.validate(), "Hello"):
                    pass
        except Exception as exc:  # shown in the status line; runs will report their own errors
            self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.ready_s = time.perf_counter() - start

    @property
    def warming(self) -> bool:
        return self._warming is not None and self._warming.is_alive()

    def status(self) -> tuple[str, str]:
        """(message, level) for the status line at the top of the page."""
        if self.warming:
            return LOADING_MESSAGE, "busy"
        if self.error:
            return f"Model warm-up failed: {self.error}", "warn"
        with self._lock:
            loaded = sorted({p for p, d in self._loaded if not d})
        if not loaded:
            return "Models load at the first run (the first start converts the GGUF target, ~30 s).", "info"
        took = f" in {self.ready_s:.0f} s" if self.ready_s else ""
        return f"Models ready{took}: preset {', '.join(loaded)} (loaded once per process, shared read-only by every session).", "ok"


def draft_names(config: DecodeConfig) -> list[str]:
    """The drafts a run uses (a selection, or the one draft; none for AR)."""
    if config.method != "sd":
        return []
    return list(config.select) or ([config.draft] if config.draft else [])


def default_preset() -> str:
    """The preset the app opens with and warms up: SPECVIZ_PRESET, else the offline preset where its wheel is
    installed, else the hub's copy of the same model (see :func:`specviz.models.presets.default_preset`)."""
    name = env("SPECVIZ_PRESET")
    return name if name in PRESETS else DecodeConfig.preset


def warmup_configs(preset: str) -> list[DecodeConfig]:
    """An AR run, then one run per draft whose weights are present (plus the n-gram drafter)."""
    configs = [DecodeConfig(preset=preset, method="ar", max_new_tokens=2)]
    for draft in available_drafts(preset):
        configs.append(DecodeConfig(preset=preset, method="sd", draft=draft, gamma=2, gamma_policy="fixed", max_new_tokens=2))
    return configs


def available_drafts(preset: str) -> list[str]:
    """The preset's drafts that can load now (hub ids count as available) and the model-free drafters."""
    drafts = resolve_preset(preset).drafts
    present = [name for name, src in drafts.items()
               if not src.startswith("/") or Path(src, "config.json").exists() or is_feature_head(Path(src))]
    return present + list(MODEL_FREE_DRAFTS)


def draft_choices(preset: str) -> list[tuple[str, str]]:
    """(label, value) choices for the draft dropdown: the preset's drafts, marked when weights are missing, + n-gram."""
    drafts = resolve_preset(preset).drafts if preset in PRESETS else {}
    present = set(available_drafts(preset)) if preset in PRESETS else set(MODEL_FREE_DRAFTS)
    choices = [(name if name in present else f"{name} (weights not found yet)", name) for name in drafts]
    return choices + [("ngram (prompt lookup, no model)", NGRAM_DRAFT),
                      ("ngram-earliest (vLLM's n-gram rule, no model)", MODEL_FREE_DRAFTS[1])]


def default_draft(preset: str) -> str:
    drafts = available_drafts(preset) if preset in PRESETS else [NGRAM_DRAFT]
    return drafts[0]


_shared: Models | None = None
_shared_lock = threading.Lock()


def shared_models() -> Models:
    """The process's one Models (created on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Models()
        return _shared
