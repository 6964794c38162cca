"""The target's last hidden state *before* its final norm, captured during an ordinary forward.

Judge decoding reads this tensor from the verify pass itself. In Llama-style models the returned
``hidden_states[-1]`` is already normed, so a forward pre-hook on ``model.model.norm`` records its
input. The hook is installed once per model and records only for the thread that asked, so sessions
that share the weights never see each other's states.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_local = threading.local()
_install_lock = threading.Lock()


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The norm applied after the last decoder layer (``model.model.norm`` in Llama-style models)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise ValueError(f"{type(model).__name__} has no final norm at model.model.norm; judge decoding needs one")
    return norm


def _record(module: torch.nn.Module, args: tuple) -> None:
    slot = getattr(_local, "slot", None)
    if slot is not None and slot["module"] is module:
        slot["states"] = args[0]


@contextmanager
def capture_prenorm(model: torch.nn.Module) -> Iterator[dict]:
    """Within the block, forwards of ``model`` on this thread store their pre-norm states in
    ``slot["states"]`` (batch, seq, hidden)."""
    norm = final_norm(model)
    with _install_lock:
        if not getattr(norm, "_specviz_prenorm_hook", False):
            norm.register_forward_pre_hook(_record)
            norm._specviz_prenorm_hook = True
    slot, outer = {"module": norm, "states": None}, getattr(_local, "slot", None)
    _local.slot = slot
    try:
        yield slot
    finally:
        _local.slot = outer


@torch.inference_mode()
def prenorm_states(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Pre-norm states (len(ids), hidden) of a whole sequence, in one cache-free forward."""
    with capture_prenorm(model) as slot:
        model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=1)
    return slot["states"][0]
