"""Optional ZeroGPU support: ``gpu`` is ``spaces.GPU`` on Hugging Face Spaces and a no-op elsewhere.

Decorated handlers are generators whose yielded values are plain data, plotly figures and DataFrames,
so they pickle across the ZeroGPU process boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def identity(fn: F) -> F:
    return fn


try:
    import spaces

    gpu = spaces.GPU
except ImportError:
    gpu = identity
