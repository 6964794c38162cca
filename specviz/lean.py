"""A lean forward for Llama-style models: the weights of a transformers model, a preallocated KV cache and a
dozen tensor ops per layer, in the spirit of gpt-fast's ``generate.py``.

A small model spends much of a transformers forward in Python (masks, cache objects, module hooks), not in
arithmetic: about 8 % of a SmolLM2-135M step on a 2-core CPU, most of a few-million-parameter draft's.
:class:`LeanCachedModel` keeps :class:`~specviz.cache.CachedModel`'s contract (full token list in, logits of
the last ``keep`` positions out, pre-norm states on request, lazy rollback to the common prefix), so drafters
and the engine cannot tell them apart. Both the target and the drafts run on it. On an fp32 CPU model it
calls the model's own prepacked linear layers, and its logits are bitwise those of transformers' forward
(``tests/test_lean.py``), so greedy decoding still matches ``generate`` token for token.

A draft that ships a ``draft_vocab.json`` (see ``specviz.train vocab``) scores only those token ids, as in
FR-Spec: the other logits are -inf, so the draft never proposes them and its q is exactly the distribution
it samples from (speculative sampling stays exact). The target always scores the full vocabulary.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .cache import CachedModel
from .models import LoadedModel, is_packed


def supports_lean(lm: LoadedModel) -> bool:
    """Plain Llama: no biases, SiLU MLP, default RoPE, a single tensor-parallel slice."""
    c = lm.model.config
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    return (c.model_type == "llama" and not c.attention_bias and not getattr(c, "mlp_bias", False) and c.hidden_act == "silu"
            and getattr(c, "pretraining_tp", 1) == 1 and rope.get("rope_type", "default") == "default")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in float32, scale in the input dtype."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def fused(modules: list[torch.nn.Module], packed: bool) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The outputs of several linear layers over one input: one matmul over their concatenated weights, or on a
    prepacked model each layer itself (no second packed copy of the weights)."""
    if packed:
        return lambda h: tuple(m(h) for m in modules)
    weight = torch.cat([m.weight for m in modules])
    sizes = [m.weight.shape[0] for m in modules]
    return lambda h: F.linear(h, weight).split(sizes, -1)


_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lean_layers(model: torch.nn.Module, layers: list[torch.nn.Module] | None = None) -> list[tuple]:
    """Per decoder layer (``model.model.layers`` unless given): (input norm, fused q|k|v, o, post-attention norm,
    fused gate|up, down). Built once per model and shared by every run on it, so fused weights are concatenated
    (and held) once, not per request."""
    weight = next(model.parameters())
    key = (weight.dtype, weight.device, is_packed(model))  # a model moved or repacked since gets fresh copies
    if model not in _LAYERS or _LAYERS[model][0] != key:
        _LAYERS[model] = key, [(layer.input_layernorm.weight, fused([a.q_proj, a.k_proj, a.v_proj], key[2]), a.o_proj,
                                layer.post_attention_layernorm.weight, fused([mlp.gate_proj, mlp.up_proj], key[2]), mlp.down_proj)
                               for layer, a, mlp in ((x, x.self_attn, x.mlp) for x in layers or model.model.layers)]
    return _LAYERS[model][1]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class LeanStack:
    """Decoder layers (tuples from :func:`lean_layers`) over a static KV cache that grows by doubling."""

    def __init__(self, layers: list[tuple], config, dtype: torch.dtype, device: torch.device, inv_freq: torch.Tensor):
        self.layers, self.dtype, self.device = layers, dtype, device
        self.heads, self.kv_heads, self.eps = config.num_attention_heads, config.num_key_value_heads, config.rms_norm_eps
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.inv_freq = inv_freq.float().to(device)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def _reserve(self, length: int) -> None:
        have = 0 if self.k is None else self.k.shape[3]
        if length <= have:
            return
        shape = (len(self.layers), 1, self.kv_heads, max(length, 2 * have, 256), self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros_like(k)
        if have:
            k[:, :, :, :have], v[:, :, :, :have] = self.k, self.v
        self.k, self.v = k, v

    def run(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Hidden states (1, t, hidden) at positions start.. through every layer; their keys and values
        overwrite the cache from ``start`` on (positions after them are ignored)."""
        t = x.shape[1]
        end = start + t
        self._reserve(end)
        angles = torch.arange(start, end, device=self.device, dtype=torch.float32)[:, None] * self.inv_freq
        angles = torch.cat([angles, angles], -1)
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        mask = None if t == 1 else torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start)
        for i, (ln1, qkv, o, ln2, gate_up, down) in enumerate(self.layers):
            q, k, v = qkv(rms_norm(x, ln1, self.eps))
            q = rotate(q.view(1, t, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            self.k[i, :, :, start:end] = rotate(k.view(1, t, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            self.v[i, :, :, start:end] = v.view(1, t, self.kv_heads, self.head_dim).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, self.k[i, :, :, :end], self.v[i, :, :, :end], attn_mask=mask,
                                               enable_gqa=self.kv_heads != self.heads)
            x = x + o(y.transpose(1, 2).reshape(1, t, self.heads * self.head_dim))
            g, u = gate_up(rms_norm(x, ln2, self.eps))
            x = x + down(F.silu(g) * u)
        return x


class LeanCachedModel(CachedModel):
    """A :class:`~specviz.cache.CachedModel` whose forward is :meth:`_run` over a :class:`LeanStack`."""

    def __init__(self, lm: LoadedModel, vocab_size: int | None = None, full_vocab: bool = True):
        m = lm.model
        self.embed, self.norm, self.eps = m.model.embed_tokens.weight, m.model.norm.weight, m.config.rms_norm_eps
        self.stack_args = lean_layers(m), m.config, self.embed.dtype, self.embed.device, m.model.rotary_emb.inv_freq
        super().__init__(lm, vocab_size)
        self.head_ids: torch.Tensor | None = None
        self.head: Callable[[torch.Tensor], torch.Tensor] = m.lm_head
        if lm.draft_vocab and not full_vocab:
            ids = torch.tensor(sorted({i for i in lm.draft_vocab if i < self.vocab_size}), device=self.embed.device)
            rows = m.lm_head.weight[ids].contiguous()
            self.head_ids, self.head = ids, lambda h: F.linear(h, rows)

    def _init_cache(self) -> None:
        self.stack = LeanStack(*self.stack_args)

    def _drop_after(self, n: int) -> None:
        """Nothing to do: positions from ``n`` on are overwritten by the next feed."""

    def _run(self, new: list[int], keep: int, capture: bool) -> torch.Tensor:
        """Feed ``new`` at positions len(self.ids).. and return logits of the last ``keep``."""
        x = F.embedding(torch.tensor(new, device=self.embed.device), self.embed)[None]
        x = self.stack.run(x, len(self.ids))[0]
        self.states = x if capture else None
        logits = self.head(rms_norm(x[-keep:], self.norm, self.eps))
        if self.head_ids is None:
            return logits
        return logits.new_full((keep, self.vocab_size), float("-inf")).index_copy_(1, self.head_ids, logits)


def cached_model(lm: LoadedModel, vocab_size: int | None = None, full_vocab: bool = True) -> CachedModel:
    """The cached model a target or a draft runs on: the lean forward where the architecture allows (over the
    model's draft vocabulary unless ``full_vocab``), transformers' otherwise."""
    return LeanCachedModel(lm, vocab_size, full_vocab) if supports_lean(lm) else CachedModel(lm, vocab_size)
