"""CPU kernels: the narrow GEMM for target forwards of a few rows, oneDNN prepacking, weight-only int8 matmuls
for bf16 drafts, and the per-model fp32/bf16 autotune. Nothing here changes what a model computes beyond rounding."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

from specviz.models.paths import cache_dir


class PackedLinear(torch.nn.Module):
    """A CPU fp32 linear layer with the kernel that measured fastest for the number of rows it is given.

    Up to :attr:`narrow_rows` rows (a plain step, or a verify with γ <= 3) it is MKL's GEMM with the weight as
    the left operand and the rows, padded to an even count, as 2 or 4 columns, which measured cheaper than any
    1-row kernel and about as cheap for 4 rows as for 2. More rows (prefill, long verifies) use the weight
    reordered once into oneDNN's blocked layout, which beat transformers' default (MKL ``x @ W.T``) there.
    ``scripts/measure_linear_kernels.py`` times all three (``results/linear_kernels.md``). The kernels differ from
    the default by rounding only (~1e-4 in the logits). ``weight`` stays the module's parameter (tied weights
    stay tied); an input of another dtype, after a ``.to()``, uses it directly."""

    narrow_rows = 4

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = linear.weight.detach().float().to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or self.weight.dtype != torch.float32:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        if n <= self.narrow_rows:
            # cat always copies: MKL's fast path wants the columns in a fresh contiguous buffer, and the
            # output is made contiguous so the next layer's input is too (strided inputs take a slow path).
            columns = torch.cat([rows, rows[: n % 2]]).t()
            y = torch.mm(self.weight, columns).t()[:n].contiguous()
        else:
            y = torch._C._nn.mkldnn_linear(rows.to_mkldnn(), self.packed, None).to_dense()
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def pack_linears(model: torch.nn.Module) -> None:
    """Swap every ``nn.Linear`` of an fp32 CPU model for a :class:`PackedLinear` (no-op without oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))


def unpack_linears(model: torch.nn.Module) -> None:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, PackedLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                linear.weight, linear.bias = child.weight, child.bias
                setattr(module, name, linear)


def is_packed(model: torch.nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())


def fastest_cpu_dtype(path: str, model: torch.nn.Module) -> torch.dtype:
    """Time what decoding does (a 64-token prefill, a 1-token and a 5-token cached forward) in fp32 (with
    packed linears) and bf16 and remember the faster per model: on CPUs without native bf16 matmuls, bf16
    wins single-token steps but loses multi-token ones badly."""
    memo = cache_dir() / "cpu_dtype_packed.json"
    table = json.loads(memo.read_text()) if memo.exists() else {}
    if path in table:
        return getattr(torch, table[path])
    from transformers import DynamicCache

    timings = {}
    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        if dtype == torch.float32:
            pack_linears(model)
        best = float("inf")
        with torch.inference_mode():
            for _ in range(3):
                cache = DynamicCache(config=model.config)
                start = time.perf_counter()
                model(ids, past_key_values=cache, logits_to_keep=1)
                for n in (1, 5):
                    model(ids[:, :n], past_key_values=cache)
                    cache.crop(-n)
                best = min(best, time.perf_counter() - start)
        timings[str(dtype).removeprefix("torch.")] = best
        unpack_linears(model)
    winner = min(timings, key=timings.get)
    memo.parent.mkdir(parents=True, exist_ok=True)
    table[path] = winner
    memo.write_text(json.dumps(table, indent=1))
    return getattr(torch, winner)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` as int8 with one fp32 scale per row: rounding moves a weight by ≤ 0.4 % of its row's largest."""
    w = weight.detach().float()
    scale = w.abs().amax(1).clamp_min(1e-12) / 127
    return (w / scale[:, None]).round().to(torch.int8).contiguous(), scale.contiguous()


def int8_kernels(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a draft in ``dtype`` on ``device`` multiplies by int8 weights: on a CPU that runs its drafts in
    bf16, torch's weight-only int8 kernel reads a quarter of fp32's bytes and runs a 1-token draft step faster
    than a bf16 matmul. Drafts only: the target always computes in its own dtype."""
    return device.type == "cpu" and dtype == torch.bfloat16 and hasattr(torch.ops.aten, "_weight_int8pack_mm")


def int8_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x @ weight.T`` with ``weight`` quantized per row (:func:`quantize_rows`); ``x`` keeps its dtype."""
    q, scale = quantize_rows(weight)
    scale = scale.to(weight.dtype)

    def apply(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), q, scale)
        return y.reshape(*x.shape[:-1], q.shape[0])
    return apply
