"""Cached forward cost of the offline target (fp32, CPU) by tokens per forward, interleaved, with three linear
kernels: transformers' default, oneDNN-prepacked weights for every row count, and what
``specviz.models.backends.cpu.PackedLinear`` ships (MKL's narrow GEMM up to 4 rows, the prepacked weights above).

    .venv/bin/python scripts/measure_linear_kernels.py [--reps 15] --out PATH      # e.g. --out out/linear_kernels.md

A 100-token context is cached once per variant; each timed forward feeds n new tokens (n = 1 is a plain
decoding step, n = γ + 1 a verify) and is cropped away again. The table also gives the largest logit
difference between each kernel and the default over the same inputs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_steps import refuse_other_settings, write_report
from transformers import DynamicCache

from specviz.bench.harness import describe_machine
from specviz.models.backends.cpu import ROW_BUCKETS, pack_linears, unpack_linears
from specviz.models.loading import load_model
from specviz.models.presets import GGUF_SOURCE
from specviz.runtime.bank import ModelBank

SIZES = (1, 2, 3, 4, 5, 8, 11)
SHIPPED = "narrow ≤ 4 rows, else oneDNN-packed"


@torch.inference_mode()
def main(reps: int, out: Path) -> None:
    command = f"Command: `.venv/bin/python scripts/measure_linear_kernels.py --reps {reps} --out {out}`."
    refuse_other_settings(out, command, f"median of {reps} interleaved repetitions")
    torch.manual_seed(0)
    variants = {name: load_model(GGUF_SOURCE, name, dtype=torch.float32).model for name in (SHIPPED, "oneDNN-packed", "default")}
    pack_linears(variants["oneDNN-packed"], ("packed",) * len(ROW_BUCKETS))
    unpack_linears(variants["default"])
    vocab = variants["default"].config.vocab_size
    context = torch.randint(0, vocab, (1, 100))
    caches = {}
    for name, model in variants.items():
        caches[name] = DynamicCache(config=model.config)
        model(input_ids=context, past_key_values=caches[name], logits_to_keep=1)
    times = {(name, n): [] for name in variants for n in SIZES}
    gap = dict.fromkeys(variants, 0.0)
    for _ in range(reps):
        for n in SIZES:
            ids = torch.randint(0, vocab, (1, n))
            logits = {}
            for name, model in variants.items():
                start = time.perf_counter()
                logits[name] = model(input_ids=ids, past_key_values=caches[name], logits_to_keep=n).logits
                times[(name, n)].append(time.perf_counter() - start)
                caches[name].crop(-n)
            for name in variants:
                gap[name] = max(gap[name], (logits["default"] - logits[name]).abs().max().item())
    ms = {key: 1e3 * statistics.median(v) for key, v in times.items()}
    lines = [f"# Target forward cost by tokens per forward ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {describe_machine(ModelBank()).rstrip('; ')}. SmolLM2-135M-Instruct, float32, 100-token cached context, "
             f"median of {reps} interleaved repetitions. {command}", "",
             "| kernel | " + " | ".join(f"{n} tok" for n in SIZES) + " | verify of 4 ÷ plain step | largest abs Δ logit vs default |",
             "|---|" + "---|" * (len(SIZES) + 2)]
    for name in variants:
        lines.append(f"| {name} | " + " | ".join(f"{ms[(name, n)]:.1f} ms" for n in SIZES)
                     + f" | {ms[(name, 4)] / ms[(name, 1)]:.2f} | {gap[name]:.1e} |")
    write_report(out, lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, required=True, help="the report file")
    a = ap.parse_args()
    main(a.reps, a.out)
