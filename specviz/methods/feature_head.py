"""A feature-level draft head, as in EAGLE: one decoder layer that drafts from the target's own hidden states.

An independent small draft must rebuild the target's view of the text from tokens alone; this head starts from
the target's hidden states. At position i it reads ``fc([embed(x[i+1]), s[i]])``, where ``embed`` is the target's
own embedding and ``s[i]`` the target's state at i: the final-normed output of its last layer (the one its LM head
turns into the distribution of x[i+1]) or, for a head that taps several depths as in EAGLE-3, ``fuse`` of the
outputs of an early, a middle and the last layer (each RMS-normalised, the last with the target's final norm). It
runs one Llama decoder layer over the positions so far and outputs the state from which the target's LM head
(restricted to the draft vocabulary) picks the next draft token; further drafts read the head's own output in
place of ``s``. The head's weights are a few million parameters; the embedding and LM head are the target's and
are not stored again.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specviz.core.cache import CachedModel, TreeRows
from specviz.core.errors import ModelLoadError, first_line
from specviz.core.hidden import final_norm
from specviz.core.registry import DRAFTERS
from specviz.core.tree import ids_tensor
from specviz.methods.state_drafter import StateDrafter
from specviz.models.backends.cpu import int8_kernels, int8_linear, quantize_rows
from specviz.models.backends.graphs import Capture, cuda_capture
from specviz.models.backends.lean import LeanStack, built_once, lean_layers, on_vocab, rms_norm, vocab_head
from specviz.models.loading import DRAFT_VOCAB_FILE, read_draft_vocab

HEAD_KIND = "feature-head"
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "specviz.json"


def head_config(target_config) -> object:
    """The target's config with one layer: the head's layer has the target's width, heads and RoPE."""
    config = type(target_config).from_dict(target_config.to_dict())
    config.num_hidden_layers = 1
    config._attn_implementation = "sdpa"
    return config


def tap_states(outputs: dict[int, torch.Tensor], taps: tuple[int, ...], target: torch.nn.Module) -> torch.Tensor:
    """The target's layer outputs a head reads, concatenated (…, len(taps)·hidden): the last layer's through the
    target's final norm, the others RMS-normalised (their scales differ by orders of magnitude)."""
    norm, last = final_norm(target), target.config.num_hidden_layers - 1
    ones = torch.ones(norm.weight.shape, dtype=norm.weight.dtype, device=norm.weight.device)
    return torch.cat([norm(outputs[i]) if i == last else rms_norm(outputs[i], ones, norm.variance_epsilon) for i in taps], -1)


class FeatureHead(torch.nn.Module):
    """``fuse`` (len(taps)·hidden → hidden, when it taps more than the last layer), ``fc`` (2·hidden → hidden) and one
    Llama decoder layer; the forward runs whole sequences over given states."""

    def __init__(self, target_config, taps: tuple[int, ...] | None = None):
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        super().__init__()
        self.config = head_config(target_config)
        width, n_layers = self.config.hidden_size, target_config.num_hidden_layers
        self.taps = tuple(taps) if taps else (n_layers - 1,)
        if sorted(set(self.taps)) != list(self.taps) or not all(0 <= i < n_layers for i in self.taps):
            raise ValueError(f"taps must be increasing layer indices of the target's {n_layers} layers, not {self.taps}")
        self.fuse = torch.nn.Linear(len(self.taps) * width, width, bias=False) if len(self.taps) > 1 else None
        self.fc = torch.nn.Linear(2 * width, width, bias=False)
        self.layer = LlamaDecoderLayer(self.config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(self.config)

    def state(self, tapped: torch.Tensor) -> torch.Tensor:
        """The state s[i] the head reads from :func:`tap_states`' output."""
        return tapped if self.fuse is None else self.fuse(tapped)

    def forward(self, states: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """Outputs (batch, t, hidden) from s[i] and embed(x[i+1]) at positions 0..t-1 (causal)."""
        x = self.fc(torch.cat([next_embeds, states], -1))
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        return self.layer(x, position_embeddings=self.rotary(x, positions))


def quantize(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Matrices as int8 with one fp32 scale per row (``name`` and ``name.scale``); vectors as fp32. A quarter of
    fp32's bytes, so the head fits beside the drafts in the repository; rounding moves a weight by ≤ 0.4 % of
    its row's largest."""
    out = {}
    for name, w in weights.items():
        if w.dim() == 2:
            out[name], scale = quantize_rows(w)
            out[name + ".scale"] = scale[:, None]
        else:
            out[name] = w.detach().float().contiguous()
    return out


def dequantize(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: w.float() * stored[name + ".scale"] if name + ".scale" in stored else w
            for name, w in stored.items() if not name.endswith(".scale")}


def save_head(head: FeatureHead, out: Path, target_name: str, report: dict, draft_vocab: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(quantize({k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}), str(out / WEIGHTS_FILE))
    config = {"kind": HEAD_KIND, "target": target_name, "taps": list(head.taps), "training": report}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    (out / DRAFT_VOCAB_FILE).write_text(json.dumps(draft_vocab))


def is_feature_head(path: Path) -> bool:
    file = Path(path) / CONFIG_FILE
    return file.is_file() and json.loads(file.read_text()).get("kind") == HEAD_KIND


def head_taps(path: Path, n_layers: int) -> tuple[int, ...]:
    """The target layers the head in ``path`` reads (heads saved without ``taps`` read the last)."""
    return tuple(json.loads((Path(path) / CONFIG_FILE).read_text()).get("taps") or (n_layers - 1,))


def head_dtype(target_model: torch.nn.Module) -> torch.dtype:
    """bfloat16 on a CPU with native bf16 matmuls (a drafting step reads half the bytes; the head's cost is
    mostly memory traffic), else the target's dtype. The dtype changes what the head proposes, never what is
    emitted: the target verifies in its own dtype."""
    if target_model.device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return target_model.dtype


def load_head(path: Path, target_model: torch.nn.Module, dtype: torch.dtype | None = None) -> tuple[FeatureHead, list[int] | None]:
    """The head in ``path`` for ``target_model`` (on its device, in ``dtype`` or :func:`head_dtype`), and its
    draft vocabulary."""
    path = Path(path)
    try:
        head = FeatureHead(target_model.config, head_taps(path, target_model.config.num_hidden_layers))
    except ValueError as exc:
        raise ModelLoadError(f"feature head '{path}' does not fit this target: {exc}") from None
    try:
        missing, unexpected = head.load_state_dict(dequantize(load_file(str(path / WEIGHTS_FILE))), strict=False)
    except Exception as exc:  # a missing file, bad safetensors header or a shape mismatch: one line either way
        raise ModelLoadError(f"cannot load feature head '{path}': {first_line(exc)[:200]}") from None
    if [k for k in missing if not k.startswith("rotary.")] or unexpected:
        raise ModelLoadError(f"feature head '{path}' does not fit this target (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return head.eval().to(device=target_model.device, dtype=dtype or head_dtype(target_model)), read_draft_vocab(path)


@DRAFTERS.register("An EAGLE-style head drafting from the target's own hidden states.", ("full_draft_vocab",), name=HEAD_KIND)
class FeatureDrafter(StateDrafter):
    """Drafts with a :class:`FeatureHead` over the target's states: the target is built with the head's ``taps`` and
    keeps those layers' outputs at its committed positions."""

    @classmethod
    def claims(cls, source: object) -> bool:
        return isinstance(source, str | Path) and is_feature_head(Path(source))

    @classmethod
    def reads_layers(cls, source: object, n_layers: int) -> tuple[int, ...]:
        return head_taps(Path(source), n_layers)

    @classmethod
    def load(cls, source: str, bank, target) -> tuple[FeatureHead, list[int] | None]:
        return bank.head(source, target)

    @classmethod
    def from_head(cls, name: str, loaded: tuple[FeatureHead, list[int] | None], context) -> FeatureDrafter:
        head, draft_vocab = loaded
        return cls(head, context.target, None if context.config.full_draft_vocab else draft_vocab, name, context.capacity,
                   cuda_capture if context.graphs else None)

    def __init__(self, head: FeatureHead, target: CachedModel, draft_vocab: list[int] | None, name: str = "head",
                 capacity: int | None = None, capture: Capture | None = None):
        super().__init__(name, target)
        self.head = head
        if not set(head.taps) <= set(target.taps):
            raise ValueError(f"the feature drafter reads the target's states: build the target with taps={head.taps}")
        lm = target.lm.model
        self.embed, self.dtype = lm.model.embed_tokens.weight, head.fc.weight.dtype
        ids = sorted({i for i in (draft_vocab or range(target.vocab_size)) if i < target.vocab_size})
        self.vocab_ids = torch.tensor(ids, device=self.embed.device)
        int8 = int8_kernels(self.dtype, self.embed.device)
        self.fc = built_once(head, ("fc", self.dtype, self.embed.device), lambda: int8_linear(head.fc.weight)) if int8 else head.fc
        self.fuse = head.state if head.fuse is None or not int8 else \
            built_once(head, ("fuse", self.dtype, self.embed.device), lambda: int8_linear(head.fuse.weight))
        self.score = vocab_head(lm, ids, self.dtype, int8)
        self.stack = LeanStack(lean_layers(head, [head.layer], int8), head.config, self.dtype, self.embed.device, head.rotary.inv_freq,
                               capacity, capture)

    def _state(self, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        return self.fuse(tap_states(layers, self.head.taps, self.target.lm.model).to(self.dtype))

    def _forward(self, states: torch.Tensor, next_ids: list[int], start: int, rows: TreeRows | None) -> torch.Tensor:
        embeds = F.embedding(ids_tensor(next_ids, self.embed.device), self.embed)
        x = self.fc(torch.cat([embeds.to(self.dtype), states], -1))
        return self.stack.run(x[None], start, rows=rows)[0][0]

    def _logits(self, state: torch.Tensor) -> torch.Tensor:
        """The head's logits (rows, vocab) from its states: the target's LM head over the draft vocabulary, −inf elsewhere."""
        return on_vocab(self.score(state).float(), self.vocab_ids, self.target.vocab_size)

