"""ZeroGPU support: ``gpu`` is ``spaces.GPU`` on Hugging Face Spaces and a no-op elsewhere, and the duration a
decorated call asks for is computed from the work it was given.

Decorated handlers return or yield plain data, plotly figures and DataFrames only, so what they hand back pickles
across the ZeroGPU process boundary. A call asks for ``duration`` seconds of GPU time, and shorter requests queue
first: :func:`decode_seconds` prices the requested tokens at the per-token time measured on this machine (a
conservative start before the first measurement), with a cap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

START_S_PER_TOKEN = 0.05
"""Seconds per generated token before anything was measured here: a 135M model step on a GPU that is launch-bound."""
FIXED_S, MAX_S = 10.0, 120.0
"""Per call: loading to the device and prefill; and the most one call asks for."""
MARGIN = 1.5
"""The factor over the measured per-token time a call asks for."""
DECAY = 0.7
"""The weight of the old per-token time in the exponential average (the newest measurement gets the rest)."""

_measured = {"s_per_token": None}
_lock = threading.Lock()


def observe_speed(tokens: int, seconds: float) -> None:
    """Remember what a decode cost (an exponential average over runs)."""
    if tokens <= 0 or seconds <= 0:
        return
    with _lock:
        old = _measured["s_per_token"]
        _measured["s_per_token"] = seconds / tokens if old is None else DECAY * old + (1 - DECAY) * seconds / tokens


def decode_seconds(tokens: int, runs: int = 1) -> int:
    """GPU seconds to ask for ``runs`` decodes of ``tokens`` tokens each."""
    per_token = _measured["s_per_token"] or START_S_PER_TOKEN
    return int(min(MAX_S, FIXED_S + MARGIN * per_token * tokens * runs))


def _identity(fn: Callable | None = None, **_: Any) -> Callable:
    return fn if fn is not None else (lambda f: f)


try:
    import spaces

    gpu = spaces.GPU
except ImportError:
    gpu = _identity
