"""Storages whose graphs are recorded, kept for the next run of the same model and shapes.

Recording a CUDA graph costs forwards, and a run that records its own pays that again at every call. A ZeroGPU Space
runs each call in a forked worker, which may be reused for the next call; a dedicated GPU serves every run from one
process. So a run borrows a storage that no other run holds (or builds one) and gives it back when its cached model
is collected: the next run with that model and those shapes replays the graphs already recorded. Each run's prefill
writes the cache over from the first slot, and attention reads only the slots written since, so nothing one run
cached is read by the next.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

S, U = TypeVar("S"), TypeVar("U")
KEPT_PER_SHAPE = 2
"""Storages kept per model and shape key (two runs at once each find one); more are built as needed, and dropped."""

_FREE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → {key: [storage, …]}
_LOCK = threading.RLock()  # a collection inside a locked block may give a storage back on the same thread


def borrowed(model: torch.nn.Module, key: Hashable, build: Callable[[], S], user: Callable[[S], U]) -> U:
    """``user(storage)`` (a run's cached model) over a storage of ``model`` for ``key`` that no other run holds: one given
    back earlier, else ``build()``. The storage comes back once what ``user`` returned is collected."""
    with _LOCK:
        free = _FREE.get(model, {}).get(key)
        storage = free.pop() if free else None
    storage = storage if storage is not None else build()
    owner = user(storage)
    weakref.finalize(owner, _give_back, weakref.ref(model), key, storage)
    return owner


def waiting(model: torch.nn.Module, key: Hashable) -> int:
    """How many storages of ``model`` for ``key`` wait for a run."""
    with _LOCK:
        return len(_FREE.get(model, {}).get(key, ()))


def _give_back(model_ref: weakref.ref, key: Hashable, storage: object) -> None:
    model = model_ref()
    if model is None:
        return
    with _LOCK:
        free = _FREE.setdefault(model, {}).setdefault(key, [])
        if len(free) < KEPT_PER_SHAPE:
            free.append(storage)
