"""Where an autoregressive step's time goes: specviz's AR decode against transformers' ``generate`` on the offline
target (fp32, greedy, CPU), each profiled with ``torch.profiler`` over the same prompt and token count, the operators
grouped into linear layers, attention, the KV cache's writes, norms and rotary, and the rest.

    .venv/bin/python scripts/profile_ar_step.py [--tokens 64] [--rounds 3] --out PATH    # e.g. --out out/ar_step_profile.md

Each engine decodes the prompt ``rounds`` times outside the profiler first (warm-up, and the tokens/s of the fastest),
then once under it. transformers runs on its stock linear kernels (``stock_linears``), specviz on the kernels chosen for
this machine. The per-token milliseconds are the profiler's self CPU time of each group divided by the tokens decoded
(prefill included, which both engines run once).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch
from bench_steps import refuse_other_settings, write_report
from torch.profiler import ProfilerActivity, profile

from specviz.bench.harness import describe_machine, hf_generate
from specviz.models.backends.cpu import kernel_plan, stock_linears
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare

PROMPT = "Explain in a few sentences why the sky is blue."
GROUPS = (  # the first group whose any substring is in an operator's name takes its time
    ("linear layers", ("linear", "addmm", "mm", "matmul", "mkldnn", "onednn", "gemm", "_weight_int8pack")),
    ("attention", ("scaled_dot_product", "attention", "softmax", "bmm", "baddbmm")),
    ("KV cache writes", ("index_copy", "index_put", "cat", "copy_", "slice_scatter", "narrow", "select_scatter")),
    ("norms and rotary", ("rms", "pow", "rsqrt", "mean", "neg", "cos", "sin")),
    ("elementwise", ("mul", "add", "silu", "sub", "div", "to", "_to_copy", "where", "masked_fill")),
)


def group_of(name: str) -> str:
    lowered = name.lower()
    return next((group for group, keys in GROUPS if any(k in lowered for k in keys)), "other")


def profiled(run) -> tuple[dict[str, float], float]:
    """Self CPU ms per group of one call of ``run`` under the profiler, and the call's wall ms."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run()
        wall = 1e3 * (time.perf_counter() - start)
    ms: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        ms[group_of(event.key)] += event.self_cpu_time_total / 1e3
    return dict(ms), wall


def fastest(run, rounds: int) -> float:
    """Least wall seconds over ``rounds`` calls."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


@torch.inference_mode()
def main(tokens: int, rounds: int, out: Path) -> None:
    command = f"Command: `.venv/bin/python scripts/profile_ar_step.py --tokens {tokens} --rounds {rounds} --out {out}`."
    refuse_other_settings(out, command)
    bank = ModelBank()
    config = DecodeConfig(method="ar", max_new_tokens=tokens)
    run = prepare(config, PROMPT, bank)
    model = run.target.lm.model
    emitted: dict[str, list[int]] = {}

    def specviz_ar() -> None:
        emitted["specviz"] = [t for e in prepare(config, PROMPT, bank).events() for t in e.emitted_ids]

    def transformers_generate() -> None:
        with stock_linears(model):
            emitted["transformers"] = hf_generate(model, None, run.prompt_ids, 0, tokens, run.stop_ids)[0]

    engines = {"specviz AR": specviz_ar, "transformers generate": transformers_generate}
    seconds = {name: fastest(call, rounds) for name, call in engines.items()}
    profiles = {name: profiled(call) for name, call in engines.items()}
    n = {name: len(emitted["specviz" if name.startswith("specviz") else "transformers"]) for name in engines}
    groups = [g for g, _ in GROUPS] + ["other"]
    rate = {name: n[name] / seconds[name] for name in engines}
    lines = [
        "# One AR step, specviz against transformers' generate", "",
        f"Machine: {describe_machine(bank)}. specviz's kernel plan for the target: {kernel_plan(model)}; transformers on "
        f"its stock `nn.Linear`.",
        f"Greedy, {tokens} new tokens after one chat prompt ({len(run.prompt_ids)} tokens); same tokens: "
        f"{'yes' if emitted['specviz'] == emitted['transformers'] else 'no'}.",
        command, "",
        "Self CPU time per generated token, by operator group (`torch.profiler`, one profiled run each after "
        f"{rounds} unprofiled ones; the profiler's own overhead is in every row):", "",
        "| group | " + " | ".join(f"{name} ms/token" for name in engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for g in groups:
        lines.append(f"| {g} | " + " | ".join(f"{profiles[name][0].get(g, 0.0) / n[name]:.2f}" for name in engines) + " |")
    lines.append("| total (profiled wall) | " + " | ".join(f"{profiles[name][1] / n[name]:.2f}" for name in engines) + " |")
    lines += ["", "Unprofiled, fastest of the rounds:", "",
              "| engine | tok/s |", "|---|---|",
              *[f"| {name} | {rate[name]:.2f} |" for name in engines],
              "", f"specviz ÷ transformers: {rate['specviz AR'] / rate['transformers generate']:.2f}×."]
    write_report(out, lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    main(a.tokens, a.rounds, a.out)
