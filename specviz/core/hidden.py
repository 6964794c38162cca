"""The target's decoder-layer outputs, returned by an ordinary forward.

Judge decoding reads the last layer's output (the state *before* the final norm: in Llama-style models the returned
``hidden_states[-1]`` is already normed), a feature head the outputs of a few chosen layers; both come from the
verify pass itself. The lean storage returns them from its own forward; over transformers' forward they come through
transformers' own ``output_hidden_states``, asking for the tapped layers only (:func:`layer_outputs`).
"""

from __future__ import annotations

import torch


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The norm applied after the last decoder layer (``model.model.norm`` in Llama-style models)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise ValueError(f"{type(model).__name__} has no final norm at model.model.norm; reading its states needs one")
    return norm


def last_layer(model: torch.nn.Module) -> int:
    """The index of the last decoder layer: its output is the pre-norm state."""
    return model.config.num_hidden_layers - 1


def layer_outputs(model: torch.nn.Module, taps: tuple[int, ...], **inputs) -> tuple[object, dict[int, torch.Tensor]]:
    """One forward of ``model`` (a transformers causal LM or its base model) on ``inputs``, and the output (batch, seq,
    hidden) of each decoder layer in ``taps``; the last layer's is its own, before the final norm."""
    n = model.config.num_hidden_layers
    if any(not 0 <= i < n for i in taps):
        raise ValueError(f"layer taps {taps} outside the model's {n} decoder layers")
    if not taps:
        return model(**inputs), {}
    model.config.tie_last_hidden_states = False  # else transformers hands the normed state as the last layer's
    out = model(**inputs, output_hidden_states=[i + 1 for i in taps])  # hidden_states[0] is the embeddings
    return out, {i: out.hidden_states[i + 1] for i in taps}


@torch.inference_mode()
def prenorm_states(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Pre-norm states (len(ids), hidden) of a whole sequence, in one cache-free forward."""
    last = last_layer(model)
    _, out = layer_outputs(model, (last,), input_ids=torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=1)
    return out[last][0]
