"""A published EAGLE-3 head as a draft: the head, its cache and its drafter, for either layout (EAGLE's: SafeAILab,
yuhuili, AngelSlim; speculators': RedHatAI) as :mod:`specviz.methods.eagle3_format` reads it; the forward follows the
reference (EAGLE's ``eagle/model/cnets.py``, vLLM's ``llama_eagle3.py``).

The head drafts from the target's residual stream at three depths: ``hidden_states[j]`` in transformers' numbering
(the input of decoder layer j, the output of layer j − 1), j = 2, L//2, L − 3 by default or the checkpoint's
``eagle_aux_hidden_state_layer_ids`` read the same way (vLLM's convention; SGLang adds one to explicit ids). They are
concatenated low to high and ``fc`` maps them to the head's width: g[t]. At position t the head's one decoder layer
feeds ``concat(input_layernorm(embed(x[t+1])), hidden_norm(g[t]))`` to attention, with g[t] as the residual
(normalised first where ``norm_before_residual``), then the post-attention norm, the MLP and their residual. Its
output h[t] goes through ``norm`` to ``lm_head`` over the draft vocabulary, whose index i is target id i + d2t[i].
Later drafts of a step feed h back in place of g, without ``fc``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specviz.core.cache import CachedModel, TreeRows, grown
from specviz.core.errors import ModelLoadError, first_line
from specviz.core.registry import DRAFTERS
from specviz.core.tree import ids_tensor
from specviz.methods.eagle3_format import LAYER_KEYS, WEIGHT_FILES, HeadSpec, head_dir, read_spec, read_weights
from specviz.methods.state_drafter import StateDrafter
from specviz.models.backends.graphs import Capture, Graphs, cuda_capture
from specviz.models.backends.lean import on_vocab, rms_norm, rotate


class HeadCache:
    """One sequence's keys and values in a head's layer (kv heads, positions, head dim); rollback is writing over. It
    grows by doubling, or with a fixed ``capacity`` (as on CUDA) keeps every shape fixed: rows are written at their
    slots and attention reads every slot under a mask, so the head's forward can be recorded as a graph."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def write(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``, ``v`` (kv heads, t, head dim) at ``slots`` (consecutive, the last end − 1); the keys and values
        attention reads: slots 0..end−1, or every slot of a fixed capacity (``end`` unread)."""
        if self.capacity is None:
            start = end - k.shape[1]
            self.k, self.v = grown(self.k, end, k, 1), grown(self.v, end, v, 1)
            self.k[:, start:end], self.v[:, start:end] = k, v
            return self.k[:, :end], self.v[:, :end]
        if self.k is None:
            self.k = k.new_zeros(k.shape[0], self.capacity, k.shape[2])
            self.v = torch.zeros_like(self.k)
        self.k.index_copy_(1, slots, k)
        self.v.index_copy_(1, slots, v)
        return self.k, self.v


class Eagle3Head:
    """A published head's weights on the target's device and dtype, checked against the target, and its forward."""

    def __init__(self, spec: HeadSpec, weights: dict[str, torch.Tensor], target: torch.nn.Module, dtype: torch.dtype | None = None):
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        name, tc = spec.path, target.config
        required = ["fc.weight", "norm.weight", "lm_head.weight", *("layer." + k for k in LAYER_KEYS)]
        missing = [k for k in required if k not in weights]
        if missing:
            raise ModelLoadError(f"EAGLE-3 head '{name}': unknown layout, no {missing[0]} (it has {', '.join(sorted(weights)[:4])}, …)")
        width = weights["fc.weight"].shape[1]
        if width % 3 or (spec.target_hidden or width // 3) != tc.hidden_size or width // 3 != tc.hidden_size:
            raise ModelLoadError(f"EAGLE-3 head '{name}' reads target states of width {spec.target_hidden or width // 3}; "
                                 f"this target's hidden size is {tc.hidden_size}")
        target_archs = tuple(tc.architectures or ())
        if spec.vocab_size != tc.vocab_size or (spec.verifier and target_archs and not set(spec.verifier) & set(target_archs)):
            raise ModelLoadError(f"EAGLE-3 head '{name}' was trained for a {'/'.join(spec.verifier) or 'target'} with a "
                                 f"{spec.vocab_size}-token vocabulary; this target is a {'/'.join(target_archs) or tc.model_type} "
                                 f"with {tc.vocab_size}: a head drafts only for its own target family")
        draft_vocab = weights["lm_head.weight"].shape[0]
        if draft_vocab < tc.vocab_size and "d2t" not in weights:
            raise ModelLoadError(f"EAGLE-3 head '{name}' scores {draft_vocab} of the target's {tc.vocab_size} tokens but has no d2t "
                                 "to map them to target ids")
        n_layers = tc.num_hidden_layers
        self.hidden_ids, self.taps = spec.hidden_ids(n_layers), spec.taps(n_layers)
        if not all(1 <= j <= n_layers for j in self.hidden_ids):
            raise ModelLoadError(f"EAGLE-3 head '{name}' reads hidden_states {list(self.hidden_ids)}; this target has "
                                 f"hidden_states 1..{n_layers} (0, the embeddings, is not read)")
        device, self.dtype = target.device, dtype or target.dtype
        self.w = {k: v.to(device=device, dtype=self.dtype) for k, v in weights.items() if k not in ("d2t", "t2d")}
        d2t = weights.get("d2t", torch.zeros(draft_vocab, dtype=torch.long)).to(device=device, dtype=torch.long)
        self.vocab_ids = torch.arange(draft_vocab, device=device) + d2t
        self.embed = self.w.get("embed_tokens.weight", target.model.embed_tokens.weight.to(self.dtype))
        config = LlamaConfig(**{k: v for k, v in spec.layer.items() if k not in ("architectures", "auto_map")})
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps, self.norm_before_residual = config.rms_norm_eps, spec.norm_before_residual
        self.rotary = LlamaRotaryEmbedding(config).to(device)

    def fuse(self, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        """g: ``fc`` over the tapped states (fed, 3·H_target), concatenated low to high."""
        return F.linear(torch.cat([layers[j - 1] for j in self.hidden_ids], -1).to(self.dtype), self.w["fc.weight"])

    def forward(self, states: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                cache: HeadCache, end: int) -> torch.Tensor:
        """Pre-norm outputs h (t, H) from the states g (t, H) and the next tokens ``ids`` (t,), at rotary ``positions``,
        written to ``cache`` at ``slots`` (the last end − 1) and attending where ``mask`` (t, the keys ``cache``
        returns) says. Only tensors vary from call to call under a fixed capacity, so the forward can be recorded."""
        w, t = self.w, states.shape[0]
        emb = rms_norm(F.embedding(ids, self.embed), w["layer.input_layernorm.weight"], self.eps)
        normed = rms_norm(states, w["layer.hidden_norm.weight"], self.eps)
        x = torch.cat([emb, normed], -1)
        cos, sin = self.rotary(x, positions[None])
        q = rotate(F.linear(x, w["layer.self_attn.q_proj.weight"]).view(t, self.heads, self.head_dim).transpose(0, 1), cos, sin)
        k = rotate(F.linear(x, w["layer.self_attn.k_proj.weight"]).view(t, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
        v = F.linear(x, w["layer.self_attn.v_proj.weight"]).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        keys, values = cache.write(k, v, slots, end)
        y = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        attended = F.linear(y[0].transpose(0, 1).reshape(t, -1), w["layer.self_attn.o_proj.weight"])
        h = (normed if self.norm_before_residual else states) + attended
        m = rms_norm(h, w["layer.post_attention_layernorm.weight"], self.eps)
        return h + F.linear(F.silu(F.linear(m, w["layer.mlp.gate_proj.weight"])) * F.linear(m, w["layer.mlp.up_proj.weight"]),
                            w["layer.mlp.down_proj.weight"])

    def logits(self, h: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Logits over the target's ``vocab_size`` ids from pre-norm outputs h (t, H): the draft vocabulary's scores
        at their target ids, −inf elsewhere."""
        scores = F.linear(rms_norm(h, self.w["norm.weight"], self.eps), self.w["lm_head.weight"]).float()
        return on_vocab(scores, self.vocab_ids, vocab_size)


def load_eagle3(source: str | Path, target: torch.nn.Module) -> Eagle3Head:
    """The published head ``source`` (a directory or hub id) for ``target``, on its device and in its dtype."""
    path = head_dir(source)
    if path is None:
        raise ModelLoadError(f"'{source}' is not an EAGLE-3 head directory or hub id")
    if not Path(source).is_dir() and not any((path / f).is_file() for f in WEIGHT_FILES):
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(str(source), allow_patterns=["*.json", *WEIGHT_FILES]))
        except Exception as exc:
            raise ModelLoadError(f"cannot download EAGLE-3 head '{source}': {first_line(exc)[:160]}") from None
    return Eagle3Head(read_spec(path), read_weights(path), target)


@DRAFTERS.register("A published EAGLE-3 head (EAGLE or speculators layout) drafting from the target's states.", name="eagle3")
class Eagle3Drafter(StateDrafter):
    """Drafts with an :class:`Eagle3Head`: the target's state at a position is g, ``fc`` over its tapped layers."""

    @classmethod
    def claims(cls, source: object) -> bool:
        return head_dir(source) is not None

    @classmethod
    def reads_layers(cls, source: object, n_layers: int) -> tuple[int, ...]:
        return read_spec(head_dir(source)).taps(n_layers)

    @classmethod
    def load(cls, source: str, bank, target) -> Eagle3Head:
        return bank.eagle3(source, target)

    @classmethod
    def from_head(cls, name: str, loaded: Eagle3Head, context) -> Eagle3Drafter:
        return cls(loaded, context.target, name, context.capacity, cuda_capture if context.graphs else None)

    def __init__(self, head: Eagle3Head, target: CachedModel, name: str = "eagle3", capacity: int | None = None,
                 capture: Capture | None = None):
        if not set(head.taps) <= set(target.taps):
            raise ValueError(f"the EAGLE-3 drafter reads the target's states: build the target with taps={head.taps}")
        if capture is not None and capacity is None:
            raise ValueError("graphs need static shapes: give the head a fixed capacity")
        super().__init__(name, target)
        self.head, self.cache = head, HeadCache(capacity)
        self.graphs = Graphs(self._static, capture) if capture else None

    def _state(self, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        return self.head.fuse(layers)

    def _forward(self, states: torch.Tensor, next_ids: list[int], start: int, rows: TreeRows | None) -> torch.Tensor:
        device, t, capacity = states.device, len(next_ids), self.cache.capacity
        end = start + t
        if capacity is not None and end > capacity:
            raise ValueError(f"position {end - 1} is past the EAGLE-3 head cache's fixed capacity of {capacity} positions")
        ids, slots = ids_tensor(next_ids, device), torch.arange(start, end, device=device)
        positions = slots if rows is None else rows.positions.to(device)
        keys = end if capacity is None else capacity
        mask = torch.arange(keys, device=device) <= slots[:, None] if rows is None else F.pad(rows.visible.to(device), (0, keys - end))
        inputs = (states.to(self.head.dtype), ids, positions, slots, mask)
        return (self.graphs(t, *inputs) if self.graphs is not None else self._static(t, *inputs))[0]

    def _static(self, t: int, states: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor]:
        """The head's forward over ``t`` fed rows: under a fixed capacity, every shape depends on ``t`` alone (the key of
        its graph); the growing cache reads the slots up to the mask's width."""
        return (self.head.forward(states, ids, positions, slots, mask, self.cache, mask.shape[1]),)

    def _logits(self, state: torch.Tensor) -> torch.Tensor:
        return self.head.logits(state, self.target.vocab_size)
