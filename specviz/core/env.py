"""Every environment variable specviz reads, with what it does: code reads them through :func:`env` and
:func:`env_flag` only, so this table is complete (a test holds it to that) and the docs render it."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """An environment variable: its default (as the text the code falls back to, or a description) and its effect."""

    default: str
    effect: str


ENV: dict[str, EnvVar] = {
    "SPECVIZ_PRESET": EnvVar("`default_preset()`", "the preset the app opens with and loads first"),
    "SPECVIZ_DECODE_CONCURRENCY": EnvVar("1", "decodes that may run at once across all of the app's users"),
    "SPECVIZ_TORCH_THREADS": EnvVar("auto", "CPU threads: a number fixes torch's count; `auto` runs torch's count or half of it, "
                                    "whichever the forwards time faster, probed as they run (a shared host)"),
    "OMP_NUM_THREADS": EnvVar("unset", "read by torch at start; set, it fixes the CPU thread count, as a number in "
                              "`SPECVIZ_TORCH_THREADS` does"),
    "SPECVIZ_CACHE": EnvVar("~/.cache/specviz", "where converted models and the machine's measured kernel plans, dtype choices "
                            "and verify profiles are kept (delete a file to time it again)"),
    "PORT": EnvVar("7860", "the app's port (as Spaces and most hosts set it)"),
    "GRADIO_SERVER_PORT": EnvVar("7860", "the app's port where `PORT` is unset"),
    "SPACES_ZERO_GPU": EnvVar("unset", "set by a ZeroGPU Space: the GPU preset is the default, each decode is a GPU call "
                              "that records its own CUDA graphs"),
    "HF_HUB_OFFLINE": EnvVar("unset", "`1`: never contact the hub; hub ids fail with a one-line error, and the hub preset is "
                             "not the default"),
    "HF_TOKEN": EnvVar("unset", "the hub token a gated preset's target needs"),
}
"""By name, in the order the docs list them."""

TRUE = ("1", "t", "true", "yes")


def env(name: str) -> str:
    """The variable's value, or "" where unset (``name`` must be one of :data:`ENV`)."""
    assert name in ENV, f"{name} is read but not declared in specviz.core.env.ENV"
    return os.environ.get(name, "")


def env_flag(name: str) -> bool:
    """Whether the variable is set to a true value (1, t, true, yes; any case)."""
    return env(name).lower() in TRUE
