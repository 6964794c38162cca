"""Tokens/s with one torch thread, two, and the count chosen as it runs, on a quiet machine and while another process
keeps one core busy.

A host whose cores are shared (a free CPU Space, a laptop running other work) may leave the engine fewer cores than
torch's default thread count assumes. Every prompt runs AR and the default settings (or the ``--configs`` named) at 1 and
2 threads (the count fixed with ``SPECVIZ_TORCH_THREADS``) and at ``auto`` (a fresh chooser starting from 2 threads, as a
new process gets: ``specviz.models.backends.threads``), quiet and beside a busy loop pinned to the last core (or the
``--loads`` named), back to back in one process, alternating the order of the counts and of the loads from prompt to
prompt; after a warm-up of each. Speed is new tokens over the decode's wall time (prefill included), as in the bench.

    python scripts/threads_under_load.py --per-category 1 --max-new-tokens 64 --out results/threads_under_load_auto_epyc
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_steps import refuse_other_settings, write_report  # noqa: E402

from specviz.analysis.suites import load_suite, load_warmup  # noqa: E402
from specviz.models.backends.cpu import cpu_name  # noqa: E402
from specviz.models.backends.threads import thread_chooser  # noqa: E402
from specviz.runtime.bank import ModelBank  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402

THREADS = ("1", "2", "auto")
LOADS = ("quiet", "one core busy")


def busy_loop() -> subprocess.Popen:
    """A shell loop that keeps the machine's last core busy until it is killed."""
    return subprocess.Popen(["taskset", "-c", str(os.cpu_count() - 1), "sh", "-c", "while :; do :; done"])


CONFIGS = {"ar": {"method": "ar"}, "defaults": {}, "draft-m": {"draft": "draft-m", "gamma": 3, "gamma_policy": "fixed"}}
"""The settings a run may measure, by label (``draft-m``: a chain of a model draft, whose forwards the chooser times too)."""


def measure(per_category: int, max_new_tokens: int, labels: list[str], loads: list[str]) -> pd.DataFrame:
    bank = ModelBank()
    configs = {label: DecodeConfig(max_new_tokens=max_new_tokens, **CONFIGS[label]) for label in labels}

    def tok_s(config: DecodeConfig, prompt: str, threads: str) -> float:
        os.environ["SPECVIZ_TORCH_THREADS"] = threads
        torch.set_num_threads(os.cpu_count())
        thread_chooser.cache_clear()
        thread_chooser()
        run = prepare(config, prompt, bank)
        start = time.perf_counter()
        n = sum(len(e.emitted_ids) for e in run.events(record=False))
        return n / (time.perf_counter() - start)

    warm = load_warmup(1)[0]["prompt"]
    for config in configs.values():
        for threads in THREADS:
            tok_s(config, warm, threads)
    rows = []
    for i, row in enumerate(load_suite("all", per_category)):
        for load in loads if i % 2 == 0 else loads[::-1]:
            loop = busy_loop() if load != "quiet" else None
            try:
                for threads in THREADS if i % 2 == 0 else THREADS[::-1]:
                    for label, config in configs.items():
                        rows.append({"prompt_id": row["id"], "load": load, "threads": threads, "config": label,
                                     "tok_s": tok_s(config, row["prompt"], threads)})
                        print(f"{row['id']:>12} {load:<14} {threads} {label:<9} {rows[-1]['tok_s']:.1f}", flush=True)
            finally:
                if loop:
                    loop.kill()
                    loop.wait()
    return pd.DataFrame(rows)


def table(df: pd.DataFrame) -> str:
    lines = ["| load | configuration | 1 thread tok/s | 2 threads tok/s | auto tok/s | median 1 thread ÷ 2 threads | "
             "median auto ÷ the faster fixed count |", "|---|---|---|---|---|---|---|"]
    for (load, label), g in df.groupby(["load", "config"], sort=False):
        one, two, auto = (g[g["threads"].astype(str) == n].set_index("prompt_id")["tok_s"] for n in THREADS)
        lines.append(f"| {load} | {label} | {one.median():.1f} | {two.median():.1f} | {auto.median():.1f} | "
                     f"{statistics.median(one / two):.2f}× | {statistics.median(auto / one.combine(two, max)):.2f}× |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=["ar", "defaults"])
    ap.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    ap.add_argument("--out", type=Path, required=True, help="path stem: writes STEM.csv and STEM.md")
    a = ap.parse_args()
    command = "python scripts/threads_under_load.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    md = a.out.with_suffix(".md")
    refuse_other_settings(md, command)
    df = measure(a.per_category, a.max_new_tokens, a.configs, a.loads)
    md.parent.mkdir(parents=True, exist_ok=True)
    draft_m = ", `draft-m` the model draft at fixed γ = 3" if "draft-m" in a.configs else ""
    df.to_csv(a.out.with_suffix(".csv"), index=False)
    write_report(md, ["# One torch thread, two, and the count chosen as it runs, quiet and beside a busy core", "",
                      f"{df['prompt_id'].nunique()} prompts, {a.max_new_tokens} new tokens, greedy; `defaults` is the settings' "
                      f"defaults{draft_m}. Interleaved in one process. Machine: {cpu_name()}, {os.cpu_count()} cores, "
                      f"torch {torch.__version__}.",
                      "", table(df), "", f"Reproduce: `{command}`"])

if __name__ == "__main__":
    main()
