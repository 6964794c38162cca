"""The target's decoder-layer outputs, captured during an ordinary forward.

Judge decoding reads the last layer's output (the state *before* the final norm: in Llama-style models the returned
``hidden_states[-1]`` is already normed), a feature head the outputs of a few chosen layers; both come from the
verify pass itself. A forward hook is installed once per decoder layer and records only for the thread that asked,
so sessions that share the weights never see each other's states.
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
        raise ValueError(f"{type(model).__name__} has no final norm at model.model.norm; reading its states needs one")
    return norm


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layers at model.model.layers; reading its states needs them")
    return layers


def last_layer(model: torch.nn.Module) -> int:
    """The index of the last decoder layer: its output is the pre-norm state."""
    return model.config.num_hidden_layers - 1


def _record(module: torch.nn.Module, args: tuple, output) -> None:
    slot = getattr(_local, "slot", None)
    if slot is not None and module in slot["taps"]:
        slot["out"][slot["taps"][module]] = output[0] if isinstance(output, tuple) else output


@contextmanager
def capture_layers(model: torch.nn.Module, taps: tuple[int, ...]) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, forwards of ``model`` on this thread store the output (batch, seq, hidden) of each decoder
    layer in ``taps`` under its index in the dict yielded."""
    layers = decoder_layers(model)
    if any(not 0 <= i < len(layers) for i in taps):
        raise ValueError(f"layer taps {taps} outside the model's {len(layers)} decoder layers")
    with _install_lock:
        for i in taps:
            if not getattr(layers[i], "_specviz_tap", False):
                layers[i].register_forward_hook(_record)
                layers[i]._specviz_tap = True
    slot, outer = {"taps": {layers[i]: i for i in taps}, "out": {}}, getattr(_local, "slot", None)
    _local.slot = slot
    try:
        yield slot["out"]
    finally:
        _local.slot = outer


@torch.inference_mode()
def prenorm_states(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Pre-norm states (len(ids), hidden) of a whole sequence, in one cache-free forward."""
    last = last_layer(model)
    with capture_layers(model, (last,)) as out:
        model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=1)
    return out[last][0]
