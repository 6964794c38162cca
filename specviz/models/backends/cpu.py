"""CPU kernels: the narrow GEMM for target forwards of a few rows, oneDNN prepacking and transformers' own
``F.linear``, chosen per row count by timing them on the machine; weight-only int8 matmuls for bf16 drafts, and the
per-model fp32/bf16 autotune. Nothing here changes what a model computes beyond rounding."""

from __future__ import annotations

import json
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from specviz.core.cache import CachedModel
from specviz.models.paths import cache_dir

KERNELS = ("narrow", "packed", "default")
"""The fp32 CPU linear kernels: ``narrow``, MKL's GEMM with the weight as the left operand and the rows, padded to an even
count, as 2 or 4 columns (4 rows at most); ``packed``, the weight reordered once into oneDNN's blocked layout;
``default``, ``torch.nn.functional.linear``, what transformers runs. They differ by rounding only."""
ROW_BUCKETS = (1, 4, 16, 64)
"""The row counts a kernel plan names a kernel for: 1, 2–4, 5–16 and more (prefills); each bucket is timed at its bound."""
SHIPPED_PLAN = ("narrow", "narrow", "packed", "packed")
"""The plan measured fastest on a 2-core EPYC (``results/linear_kernels.md``); :func:`tuned_plan` measures each machine's."""

FIRST_OF_LAST = ROW_BUCKETS[-2] + 1
"""The fewest rows of the last bucket."""


def bucket(rows: int) -> int:
    """The index in :data:`ROW_BUCKETS` of a forward of ``rows`` rows."""
    return next((i for i, top in enumerate(ROW_BUCKETS[:-1]) if rows <= top), len(ROW_BUCKETS) - 1)


def candidates(index: int) -> tuple[str, ...]:
    """The kernels that can serve bucket ``index`` (the narrow GEMM takes 4 rows at most)."""
    return KERNELS if ROW_BUCKETS[index] <= 4 else KERNELS[1:]


class PackedLinear(torch.nn.Module):
    """A CPU fp32 linear layer that runs, for each count of rows it is given, the kernel its ``plan`` names for that
    count's bucket (:data:`ROW_BUCKETS`, :data:`KERNELS`). ``scripts/measure_linear_kernels.py`` times them
    (``results/linear_kernels.md``). ``weight`` stays the module's parameter (tied weights stay tied); an input of
    another dtype, after a ``.to()``, uses it directly."""

    def __init__(self, linear: torch.nn.Linear, plan: tuple[str, ...] = SHIPPED_PLAN):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed: torch.Tensor | None = None  # the oneDNN copy, made by the first forward that runs it
        self.plan = plan

    @property
    def plan(self) -> tuple[str, ...]:
        return self._plan

    @plan.setter
    def plan(self, plan: tuple[str, ...]) -> None:
        # the kernel of each row count up to the last bucket's first (more rows take the last): the forward indexes it,
        # as finding the bucket on every call of every layer cost a step more than the kernels' differences save
        self._plan, self.by_rows = plan, tuple(plan[bucket(n)] for n in range(FIRST_OF_LAST + 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or self.weight.dtype != torch.float32:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        kernel = self.by_rows[n if n < FIRST_OF_LAST else FIRST_OF_LAST]
        if kernel == "default":
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if kernel == "narrow":
            # cat always copies: MKL's fast path wants the columns in a fresh contiguous buffer, and the
            # output is made contiguous so the next layer's input is too (strided inputs take a slow path).
            columns = torch.cat([rows, rows[: n % 2]]).t()
            y = torch.mm(self.weight, columns).t()[:n].contiguous()
        else:
            if self.packed is None:
                self.packed = self.weight.detach().to_mkldnn()
            y = torch._C._nn.mkldnn_linear(rows.to_mkldnn(), self.packed, None).to_dense()
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def joined_linear(weight: torch.Tensor, plan: tuple[str, ...]) -> PackedLinear:
    """A :class:`PackedLinear` on ``plan`` over ``weight``, the stacked rows of several linears of one input (without
    biases): one matmul where there were several. Where their weights are views of ``weight`` (see
    :func:`~specviz.models.backends.lean.stacked`) its outputs are bitwise theirs side by side."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    return PackedLinear(linear, plan)


def pack_linears(model: torch.nn.Module, plan: tuple[str, ...] = SHIPPED_PLAN) -> None:
    """Swap every ``nn.Linear`` of an fp32 CPU model for a :class:`PackedLinear` running ``plan`` (no-op without
    oneDNN); an already packed model takes the new plan."""
    if not torch.backends.mkldnn.is_available():
        return
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child, plan))
            elif isinstance(child, PackedLinear):
                child.plan = plan


def _plain(packed: PackedLinear) -> torch.nn.Linear:
    linear = torch.nn.Linear(packed.in_features, packed.out_features, bias=packed.bias is not None, device="meta")
    linear.weight, linear.bias = packed.weight, packed.bias
    return linear


def _packed_children(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, PackedLinear]]:
    return [(module, name, child) for module in model.modules() for name, child in module.named_children()
            if isinstance(child, PackedLinear)]


def unpack_linears(model: torch.nn.Module) -> None:
    for module, name, child in _packed_children(model):
        setattr(module, name, _plain(child))


@contextmanager
def stock_linears(*models: torch.nn.Module) -> Iterator[None]:
    """transformers' own linear kernels in ``models`` for the duration (nn.Linear on the same weights), their packed
    layers put back after: what a transformers user runs, without packing the weights again."""
    swapped = [entry for model in models for entry in _packed_children(model)]
    for module, name, child in swapped:
        setattr(module, name, _plain(child))
    try:
        yield
    finally:
        for module, name, child in swapped:
            setattr(module, name, child)


def is_packed(model: torch.nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())


def kernel_plan(model: torch.nn.Module) -> dict[str, str] | None:
    """The kernel per row count of a packed model ("1", "2-4", "5-16", "17+"), None if it is not packed."""
    plan = next((m.plan for m in model.modules() if isinstance(m, PackedLinear)), None)
    if plan is None:
        return None
    names = [f"{lo}-{hi}" if lo < hi else str(hi) for lo, hi in zip((1, *(b + 1 for b in ROW_BUCKETS[:-2])), ROW_BUCKETS[:-1])]
    return dict(zip([*names, f"{ROW_BUCKETS[-2] + 1}+"], plan))


def cpu_name() -> str:
    """The CPU's model name with the ISA features that decide the kernels and whether bf16 pays off."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return platform.processor() or platform.machine()
    text = cpuinfo.read_text()
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", text, re.M) or [None, ""])[1].split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name[1].strip() if name else platform.machine()} ({', '.join(isa) or 'no AVX2'})"


ROUNDING = 1e-3
"""The largest logit difference from the default kernel a candidate may show (the kernels measured ~1e-4): a kernel that
changes more than rounding is never chosen."""


def fastest_exact(seconds: dict[str, list[float]], gaps: dict[str, float]) -> str:
    """The kernel with the least median time among those whose largest logit difference from the default kernel
    (``gaps``) is within :data:`ROUNDING`."""
    return min((k for k in seconds if gaps[k] <= ROUNDING), key=lambda k: statistics.median(seconds[k]))


@torch.inference_mode()
def tuned_plan(model: torch.nn.Module, reps: int = 5) -> tuple[str, ...]:
    """The fastest kernel per row bucket for the fp32 CPU ``model``, timed on this machine: a
    cached forward of each bucket's rows after a 100-token context, every candidate of :func:`candidates` against
    ``F.linear``, the median of ``reps`` interleaved repetitions. Remembered per model shape, CPU, thread count and torch
    version, so the timing runs once per machine. The model is left packed, with no particular plan: give it the one
    returned (``pack_linears``)."""
    return tuple(remembered("cpu_kernels.json", f"{model_shape(model)} | {machine_key()}", lambda: _time_kernels(model, reps)))


def _time_kernels(model: torch.nn.Module, reps: int) -> list[str]:
    from transformers import DynamicCache

    plan = list(SHIPPED_PLAN)
    pack_linears(model, tuple(plan))
    generator = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    model(torch.randint(0, model.config.vocab_size, (1, 100), generator=generator), past_key_values=cache, logits_to_keep=1)
    for i, rows in enumerate(ROW_BUCKETS):
        ids = torch.randint(0, model.config.vocab_size, (1, rows), generator=generator)
        seconds: dict[str, list[float]] = {k: [] for k in candidates(i)}
        logits: dict[str, torch.Tensor] = {}
        for rep in range(reps + 1):  # the first repetition warms up
            for kernel in seconds:
                pack_linears(model, tuple(plan[:i] + [kernel] + plan[i + 1:]))
                start = time.perf_counter()
                logits[kernel] = model(ids, past_key_values=cache, logits_to_keep=rows).logits
                if rep:
                    seconds[kernel].append(time.perf_counter() - start)
                cache.crop(-rows)
        plan[i] = fastest_exact(seconds, {k: (logits[k] - logits["default"]).abs().max().item() for k in seconds})
    return plan


def remembered(file: str, key: str, measure: Callable[[], object]) -> object:
    """What ``measure()`` returns, kept in the cache directory's JSON ``file`` under ``key``: measured once per key."""
    memo = cache_dir() / file
    table = json.loads(memo.read_text()) if memo.exists() else {}
    if key not in table:
        table[key] = measure()
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps(table, indent=1))
    return table[key]


def model_shape(model: torch.nn.Module) -> str:
    """The shapes a model's timings depend on: models of one shape time alike, wherever they load from."""
    c = model.config
    return f"{c.model_type} {c.hidden_size}x{c.num_hidden_layers} ffn {c.intermediate_size} vocab {c.vocab_size}"


def machine_key() -> str:
    """The CPU, thread count and torch version: what a timing on this machine depends on beyond the model."""
    return f"{cpu_name()} | {torch.get_num_threads()} threads | torch {torch.__version__}"


PROFILE_CONTEXT = 64
"""The committed tokens before the drafts in :func:`verify_profile`'s forwards."""


@torch.inference_mode()
def verify_profile(target: CachedModel, longest: int, reps: int = 5) -> dict[int, float]:
    """Milliseconds of the CPU ``target``'s verify of γ drafted tokens (γ + 1 rows fed after a 64-token context) for γ =
    0..``longest``, each the fastest of ``reps`` interleaved repetitions after a warm-up (a busy moment only adds); none
    on another device. It is the shape of the cost in γ, a staircase on a CPU where the kernel changes with the row count
    (``results/linear_kernels.md``), which the online γ policy reads before it has measured each γ itself. Remembered per
    model shape, dtype, storage, kernel plan and machine, so it runs once per machine. The target's cache is left empty."""
    model = target.lm.model
    if target.lm.device.type != "cpu":
        return {}
    key = (f"{model_shape(model)} {model.dtype} {type(target.storage).__name__} | kernels {kernel_plan(model)} | "
           f"{machine_key()} | γ 0..{longest}")

    def measure() -> dict[int, float]:
        context = [1 + i % (target.vocab_size - 1) for i in range(PROFILE_CONTEXT + longest + 1)]
        seconds: dict[int, list[float]] = {gamma: [] for gamma in range(longest + 1)}
        target.forward(context[:PROFILE_CONTEXT])
        for rep in range(reps + 1):  # the first repetition warms up
            for gamma in seconds:
                start = time.perf_counter()
                target.forward(context[:PROFILE_CONTEXT + gamma + 1], keep=gamma + 1)
                if rep:
                    seconds[gamma].append(time.perf_counter() - start)
                target.rollback(PROFILE_CONTEXT)
        target.rollback(0)
        return {gamma: 1e3 * min(s) for gamma, s in seconds.items()}
    return {int(gamma): ms for gamma, ms in remembered("verify_profile.json", key, measure).items()}


def fastest_cpu_dtype(path: str, model: torch.nn.Module) -> torch.dtype:
    """Time what decoding does (a 64-token prefill, a 1-token and a 5-token cached forward) in fp32 (with
    packed linears) and bf16 and remember the faster per model: on CPUs without native bf16 matmuls, bf16
    wins single-token steps but loses multi-token ones badly."""
    return getattr(torch, remembered("cpu_dtype_packed.json", path, lambda: _faster_dtype(model)))


def _faster_dtype(model: torch.nn.Module) -> str:
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
    return min(timings, key=timings.get)


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
