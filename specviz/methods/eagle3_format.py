"""The on-disk format of published EAGLE-3 heads: a head directory's ``config.json`` read into a :class:`HeadSpec`
(EAGLE or speculators layout), its weights read under one set of names, and the test of whether a source names a head."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.core.errors import ModelLoadError, first_line

LAYER_KEYS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
              "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
LAYER_PREFIXES = ("midlayer.", "layers.0.")  # the EAGLE layout, the speculators layout
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class HeadSpec:
    """What a head's ``config.json`` says: its layout, its layer's Llama fields and what it expects of the target."""

    path: Path
    layout: str
    layer: dict
    vocab_size: int
    target_hidden: int | None
    aux_ids: tuple[int, ...] | None
    norm_before_residual: bool
    verifier: tuple[str, ...]

    def hidden_ids(self, n_layers: int) -> tuple[int, ...]:
        """The ``hidden_states`` indices the head reads from a target of ``n_layers`` decoder layers, low to high (as the
        reference and vLLM collect them, in layer order)."""
        return tuple(sorted(self.aux_ids or (2, n_layers // 2, n_layers - 3)))

    def taps(self, n_layers: int) -> tuple[int, ...]:
        """The target's decoder layers whose outputs the head reads (the output of layer j − 1 is hidden_states[j])."""
        return tuple(sorted({j - 1 for j in self.hidden_ids(n_layers)}))


def is_head_config(config: dict) -> bool:
    """Whether a ``config.json`` describes an EAGLE-3 head in either published layout."""
    archs = " ".join(config.get("architectures") or []).lower()
    return (config.get("speculators_model_type") == "eagle3" or "speculators_config" in config or "eagle3" in archs
            or ("draft_vocab_size" in config and config.get("num_hidden_layers") == 1) or "eagle_config" in config)


def read_spec(path: Path) -> HeadSpec:
    """The :class:`HeadSpec` of the head directory ``path`` (a one-line ModelLoadError if it is none)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"EAGLE-3 head '{path}': cannot read config.json: {first_line(exc)[:160]}") from None
    if not is_head_config(config):
        raise ModelLoadError(f"'{path}' is not an EAGLE-3 head: its config.json has neither the EAGLE nor the speculators layout")
    speculators = "transformer_layer_config" in config or "speculators_config" in config
    layer = dict(config["transformer_layer_config"]) if speculators else dict(config)
    eagle = config.get("eagle_config") or {}
    aux = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    return HeadSpec(path, "speculators" if speculators else "eagle", layer, int(layer.get("vocab_size") or config.get("vocab_size")),
                    config.get("target_hidden_size") or layer.get("target_hidden_size"), tuple(int(i) for i in aux) if aux else None,
                    bool(config.get("norm_before_residual", False)), tuple(verifier.get("architectures") or ()))


def head_dir(source: object) -> Path | None:
    """The local directory of an EAGLE-3 head named by ``source`` (a directory or a hub id), None if it names none.
    A hub id is looked up by its config.json alone (the weights come when the head is built)."""
    if not isinstance(source, str | Path):
        return None
    path = Path(source)
    if not path.is_dir():
        text = str(source)
        if text.startswith((".", "/")) or text.count("/") != 1:
            return None
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(text, "config.json")).parent
        except Exception:  # offline, unknown or gated: the model drafter's loader says why in one line
            return None
    try:
        return path if is_head_config(json.loads((path / "config.json").read_text())) else None
    except (OSError, ValueError):
        return None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The head's tensors, the decoder layer's under ``layer.`` whichever layout named it."""
    file = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
    if file is None:
        raise ModelLoadError(f"EAGLE-3 head '{path}' has no {' or '.join(WEIGHT_FILES)}")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            raw = load_file(str(file))
        else:
            raw = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read EAGLE-3 head '{file}': {first_line(exc)[:160]}") from None
    out = {}
    for key, tensor in raw.items():
        prefix = next((p for p in LAYER_PREFIXES if key.startswith(p)), None)
        out["layer." + key[len(prefix):] if prefix else key] = tensor
    return out
