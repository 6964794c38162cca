"""A lean forward for Llama-style models: the weights of a transformers model, a preallocated KV cache and a
dozen tensor ops per layer, in the spirit of gpt-fast's ``generate.py``.

A small model spends much of a transformers forward in Python (masks, cache objects, module hooks), not in
arithmetic; the smaller the model, the larger that share.
:class:`LeanStorage` is a storage of :class:`~specviz.core.cache.CachedModel` (full token list in, logits of
the last ``keep`` positions out, pre-norm states on request, token trees under a tree mask, rollback by position), so drafters
and the engine cannot tell it from transformers' forward. Both the target and the drafts run on it. q|k|v and gate|up
are one matmul each, over weights the model's layers then view. On an fp32 CPU model it runs the model's kernel plan,
and its logits are bitwise those of transformers' forward (``tests/test_lean.py``), so greedy decoding still matches
``generate`` token for token.

A draft that ships a ``draft_vocab.json`` (see ``specviz.training.drafts vocab``) scores only those token ids, as in
FR-Spec: the other logits are -inf, so the draft never proposes them and its q is exactly the distribution
it samples from (speculative sampling stays exact). The target always scores the full vocabulary.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specviz.core.cache import TreeRows
from specviz.core.tree import ids_tensor
from specviz.models.backends.cpu import int8_kernels, int8_linear, is_packed, joined_linear
from specviz.models.backends.graphs import MAX_GRAPHED_LENGTH, Capture, Graphs
from specviz.models.loaded import LoadedModel


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in float32, scale in the input dtype."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`hf_rms_norm` on a CPU, so fp32 logits stay bitwise transformers'; on CUDA torch's fused kernel (one kernel
    in place of seven: at batch 1 a GPU step is counted in kernels, not bytes), which scales in float32 and so changes
    bf16 results by a rounding."""
    return F.rms_norm(x, weight.shape, weight, eps) if x.is_cuda else hf_rms_norm(x, weight, eps)


def stacked(modules: list[torch.nn.Module]) -> torch.Tensor:
    """The weights of ``modules`` stacked in one tensor, each module's weight becoming a view of its rows: one matmul
    serves them all and the weights are held once. The copy also aligns them, which MKL's rounding can depend on, so
    transformers' forward on the same modules stays bitwise the lean one."""
    weight = torch.cat([m.weight.detach() for m in modules])
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[start:start + rows], requires_grad=m.weight.requires_grad)
        start += rows
    return weight


def fused(modules: list[torch.nn.Module], kernel: str) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The outputs of several linear layers over one input by one matmul over their :func:`stacked` weights: dense,
    ``int8``, or on a prepacked model (``packed``) on the layers' kernel plan (:func:`joined_linear`)."""
    sizes = [m.weight.shape[0] for m in modules]
    weight = stacked(modules)
    matmul = joined_linear(weight, modules[0].plan) if kernel == "packed" else \
        int8_linear(weight) if kernel == "int8" else functools.partial(F.linear, weight=weight)
    return lambda h: matmul(h).split(sizes, -1)


_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def built_once(owner: torch.nn.Module, key: tuple, build: Callable[[], object]):
    """``build()`` once per (``owner``, ``key``) while ``owner`` lives: what every run on a model shares (fused
    or quantized weights) is made, and held, once rather than per request. Keys name the owner's dtype and
    device, so a model moved or repacked since gets fresh copies."""
    table = _BUILT.setdefault(owner, {})
    if key not in table:
        table[key] = build()
    return table[key]


def lean_layers(model: torch.nn.Module, layers: list[torch.nn.Module] | None = None, int8: bool = False) -> list[tuple]:
    """Per decoder layer (``model.model.layers`` unless given): (input norm, fused q|k|v, o, post-attention norm,
    fused gate|up, down, the per-head q and k norms of a Qwen3 layer or None), over int8 weights if ``int8`` (see
    :func:`int8_kernels`); built once per model."""
    weight = next(model.parameters())
    kernel = "packed" if is_packed(model) else "int8" if int8 else "dense"

    def single(m: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        return int8_linear(m.weight) if kernel == "int8" else m

    def build() -> list[tuple]:
        return [(layer.input_layernorm.weight, fused([a.q_proj, a.k_proj, a.v_proj], kernel), single(a.o_proj),
                 layer.post_attention_layernorm.weight, fused([mlp.gate_proj, mlp.up_proj], kernel), single(mlp.down_proj),
                 *((a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else (None, None)))
                for layer, a, mlp in ((x, x.self_attn, x.mlp) for x in layers or model.model.layers)]
    return built_once(model, ("layers", weight.dtype, weight.device, kernel), build)


def vocab_head(model: torch.nn.Module, ids: list[int] | None, dtype: torch.dtype, int8: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model``'s LM head over the token ids ``ids`` (None: all of them, as the model's own module unless
    ``int8``), its rows in ``dtype``; built once per model."""
    weight = model.lm_head.weight
    if ids is None and not int8:
        return model.lm_head

    def build() -> Callable[[torch.Tensor], torch.Tensor]:
        rows = (weight if ids is None else weight[torch.tensor(ids, device=weight.device)]).to(dtype).contiguous()
        return int8_linear(rows) if int8 else lambda h: F.linear(h, rows)
    return built_once(model, ("head", weight.dtype, weight.device, dtype, int8, None if ids is None else tuple(ids)), build)


def on_vocab(scores: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits (rows, ``vocab_size``) from ``scores`` (rows, len(ids)) over a draft vocabulary: each score at its token id in
    ``ids``, −inf at every other id, so a draft never proposes a token outside its vocabulary."""
    return scores.new_full((scores.shape[0], vocab_size), float("-inf")).index_copy_(1, ids, scores)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class LeanStack:
    """Decoder layers (tuples from :func:`lean_layers`) over a preallocated KV cache; rollback is moving a length (and,
    after a token tree, copying the accepted rows after it).

    By default the cache grows by doubling and attention reads the positions so far. With a fixed ``capacity`` (as
    on CUDA) every shape depends on the number of fed positions only: keys and values are written by position and
    attention reads the whole cache under a mask by position, as in gpt-fast; ``capture`` (see
    :mod:`.graphs`) then records one CUDA graph per shape and replays it."""

    def __init__(self, layers: list[tuple], config, dtype: torch.dtype, device: torch.device, inv_freq: torch.Tensor,
                 capacity: int | None = None, capture: Capture | None = None):
        self.layers, self.dtype, self.device = layers, dtype, device
        self.heads, self.kv_heads, self.eps = config.num_attention_heads, config.num_key_value_heads, config.rms_norm_eps
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.inv_freq = inv_freq.float().to(device)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.capacity = capacity
        if capacity is not None:
            self._reserve(capacity)
            self.key_pos = torch.arange(capacity, device=device)
        if capture is not None and capacity is None:
            raise ValueError("graphs need static shapes: give the stack a fixed capacity")
        self.graphs = Graphs(self._static, capture) if capture else None

    def _reserve(self, length: int) -> None:
        have = 0 if self.k is None else self.k.shape[3]
        if length <= have:
            return
        shape = (len(self.layers), 1, self.kv_heads, self.capacity or max(length, 2 * have, 256), self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros_like(k)
        if have:
            k[:, :, :, :have], v[:, :, :, :have] = self.k, self.v
        self.k, self.v = k, v

    def run(self, x: torch.Tensor, start: int, taps: tuple[int, ...] = (),
            rows: TreeRows | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Hidden states (1, t, hidden) of rows fed into slots start.. through every layer, and the outputs of the layers
        in ``taps``; their keys and values overwrite the cache from ``start`` on (slots after them are ignored). Rows
        sit at their slots' positions and attend causally, unless ``rows`` (a token tree) gives positions and a mask."""
        t = x.shape[1]
        end = start + t
        slots = torch.arange(start, end, device=self.device)
        pos = slots if rows is None else rows.positions.to(self.device)
        if self.capacity is None:
            self._reserve(end)
            # the fused (flash) kernels take is_causal, not a mask: a prefill (start 0) needs none, a one-token step none at all
            causal = rows is None and t > 1 and start == 0
            mask = rows.visible.to(self.device) if rows is not None else \
                None if t == 1 or causal else torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start)
            return self._layers(x, slots, pos, end, mask, causal, taps)
        if end > self.capacity:
            raise ValueError(f"position {end - 1} is past the KV cache's fixed capacity of {self.capacity} positions")
        mask = self.key_pos <= slots[:, None] if rows is None else F.pad(rows.visible.to(self.device), (0, self.capacity - end))
        graphed = self.graphs is not None and t <= MAX_GRAPHED_LENGTH and start > 0  # a prefill comes once: no recording
        out = self.graphs((t, taps), x, slots, pos, mask) if graphed else self._static((t, taps), x, slots, pos, mask)
        return out[0], dict(zip(taps, out[1:]))

    def move(self, length: int, moved: list[int] | tuple[int, ...]) -> None:
        """Copy the keys and values of the slots ``moved`` to the slots from ``length`` on (a tree's accepted path)."""
        src = torch.tensor(list(moved), device=self.device)
        dst = torch.arange(length, length + len(moved), device=self.device)
        self.k.index_copy_(3, dst, self.k.index_select(3, src))
        self.v.index_copy_(3, dst, self.v.index_select(3, src))

    def _static(self, key: tuple[int, tuple[int, ...]], x: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`run` over the whole fixed-capacity cache under ``mask`` (t, capacity), flat: the state, then each tap's
        output. Every shape depends on ``key`` (the number of fed rows, the taps) alone."""
        out, tapped = self._layers(x, slots, pos, self.capacity, mask, False, key[1])
        return (out, *(tapped[i] for i in key[1]))

    def _layers(self, x: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, keys: int, mask: torch.Tensor | None, causal: bool,
                taps: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        t, heads = x.shape[1], self.heads
        angles = pos.float()[:, None] * self.inv_freq
        angles = torch.cat([angles, angles], -1)
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        attend = self._grouped(mask, t) if self.capacity is not None else self._plain(mask, causal, t)
        outputs = {}
        for i, (ln1, qkv, o, ln2, gate_up, down, q_norm, k_norm) in enumerate(self.layers):
            q, k, v = qkv(rms_norm(x, ln1, self.eps))
            q, k = q.view(1, t, heads, self.head_dim), k.view(1, t, self.kv_heads, self.head_dim)
            if q_norm is not None:  # Qwen3: per-head RMS norms of q and k before the rotation
                q, k = rms_norm(q, q_norm, self.eps), rms_norm(k, k_norm, self.eps)
            qk = rotate(torch.cat([q, k], 2).transpose(1, 2), cos, sin)  # q and k rotated at once: half the kernels
            self.k[i].index_copy_(2, slots, qk[:, heads:])
            self.v[i].index_copy_(2, slots, v.view(1, t, self.kv_heads, self.head_dim).transpose(1, 2))
            x = x + o(attend(qk[:, :heads], self.k[i, :, :, :keys], self.v[i, :, :, :keys]))
            g, u = gate_up(rms_norm(x, ln2, self.eps))
            x = x + down(F.silu(g) * u)
            if i in taps:
                outputs[i] = x
        return x, outputs

    def _plain(self, mask: torch.Tensor | None, causal: bool, t: int) -> Callable[..., torch.Tensor]:
        """Attention over the keys so far (the growing cache): SDPA's own grouped-query path, under ``mask`` or causal."""
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.kv_heads != self.heads)
            return y.transpose(1, 2).reshape(1, t, self.heads * self.head_dim)
        return attend

    def _grouped(self, mask: torch.Tensor, t: int) -> Callable[..., torch.Tensor]:
        """Attention over the whole fixed-capacity cache under ``mask`` (t, capacity), one kernel per layer: the query heads
        that share a key head are stacked as rows of one query (head kv·g + r at row s becomes row r·t + s of group kv), so
        no key or value is repeated per head, and the mask is turned once per forward into the additive bias the fused
        kernels take (its rows 16-aligned, as the memory-efficient kernel reads them)."""
        g, d, width = self.heads // self.kv_heads, self.head_dim, mask.shape[1]
        bias = torch.full((g * t, -(-width // 16) * 16), float("-inf"), dtype=self.dtype, device=self.device)
        bias = bias[:, :width].masked_fill_(mask.repeat(g, 1), 0.0)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            y = F.scaled_dot_product_attention(q.reshape(1, self.kv_heads, g * t, d), k, v, attn_mask=bias)
            return y.view(1, self.kv_heads, g, t, d).permute(0, 3, 1, 2, 4).reshape(1, t, self.heads * d)
        return attend


class LeanStorage:
    """The cached-model storage of a Llama-style model over a :class:`LeanStack` (the lean forward), with the LM
    head over the model's draft vocabulary unless ``full_vocab`` (the other logits are -inf); ``capacity`` and
    ``capture``: the stack's static shapes and graphs."""

    def __init__(self, lm: LoadedModel, vocab_size: int, full_vocab: bool = True, int8: bool = False,
                 capacity: int | None = None, capture: Capture | None = None):
        m = lm.model
        self.embed, self.norm, self.eps = m.model.embed_tokens.weight, m.model.norm.weight, m.config.rms_norm_eps
        self.vocab_size = vocab_size
        int8 = int8 and int8_kernels(self.embed.dtype, self.embed.device)
        self.stack = LeanStack(lean_layers(m, int8=int8), m.config, self.embed.dtype, self.embed.device, m.model.rotary_emb.inv_freq,
                               capacity, capture)
        ids = sorted({i for i in lm.draft_vocab if i < vocab_size}) if lm.draft_vocab and not full_vocab else None
        self.head_ids = None if ids is None else torch.tensor(ids, device=self.embed.device)
        self.head = vocab_head(m, ids, self.embed.dtype, int8)

    def run(self, ids: list[int], start: int, keep: int, taps: tuple[int, ...],
            rows: TreeRows | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        x = F.embedding(ids_tensor(ids, self.embed.device), self.embed)[None]
        x, outputs = self.stack.run(x, start, taps, rows)
        x = x[0]
        logits = self.head(rms_norm(x[-keep:], self.norm, self.eps))
        if self.head_ids is not None:
            logits = on_vocab(logits, self.head_ids, self.vocab_size)
        return logits, {i: h[0] for i, h in outputs.items()}

    def truncate(self, length: int, moved: list[int] | tuple[int, ...] = ()) -> None:
        """Move the slots ``moved`` after ``length``; the slots after them are overwritten by the next feed."""
        if moved:
            self.stack.move(length, moved)
