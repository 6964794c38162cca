"""Render docs/spaces.md's "What a Space visitor will see" block from the GPU check's results files (``--check``: fail
if the committed block differs from what the results give).

Every figure in the block is read from ``results/cuda/2026-11-28-nvidia-h200.csv`` (``bash scripts/gpu_check.sh
--before`` on a lent H200) or computed from it with the cost model of ``specviz.analysis.cost_model``:
speedup = E(α, γ) ÷ (γ·c + T(γ+1)/T(1) + overhead/T(1)), c the head's drafting time per token over T(1).

    python scripts/render_zerogpu.py [--check]
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.analysis.cost_model import expected_tokens_by_depth  # noqa: E402

RUN = ROOT / "results" / "cuda" / "2026-11-28-nvidia-h200.csv"
BEFORE_COMMIT = "e54dfd2"  # the commit whose lean.py that run's --before named (its elsewhere line in scripts/run_benchmarks.sh)
DOC = ROOT / "docs" / "spaces.md"
BEGIN, END = "<!-- zerogpu:begin -->", "<!-- zerogpu:end -->"
GAMMA, ALPHAS = 3, (0.5, 0.6, 0.7, 0.8)
BEFORE, AFTER = "before: the layers of lean_before.py", "after: this commit's layers"
WAYS = ("eager (static shapes)", "graphs recorded in the call", "graphs kept from the worker's last call")


def rows(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, newline="") as f:
        return {(r["section"], r["metric"]): r for r in csv.DictReader(f)}


def value(table: dict, section: str, metric: str) -> str:
    try:
        return table[(section, metric)]["value"]
    except KeyError:
        raise SystemExit(f"{section} / {metric}: not in the results file") from None


def of_limit(table: dict, metric: str) -> str:
    """The share of the bandwidth limit a before/after row's note gives (its run's own copy bandwidth)."""
    found = re.search(r"([\d.]+) of the bandwidth limit", table[("8B AR before/after", metric)]["note"])
    if not found:
        raise SystemExit(f"8B AR before/after / {metric}: no share of the bandwidth limit in its note")
    return found.group(1)


def block() -> str:
    run = rows(RUN)
    gpu = value(run, "machine", "gpu")
    limit = float(value(run, "8B AR", "bandwidth limit (weight bytes ÷ copy bandwidth)"))
    lines = [f"Measured by `bash scripts/gpu_check.sh` on a lent {gpu} with random weights of Qwen3-8B's "
             f"shape in bf16 ({value(run, '8B AR', 'weight bytes')} GB; its copy bandwidth gives an AR limit of {limit:g} tok/s): "
             f"`{RUN.relative_to(ROOT)}`. Rendered by `python scripts/render_zerogpu.py`.", "",
             "**One call in a forked worker, as ZeroGPU runs it** (AR, tok/s, the prefill of a 128-token prompt and any "
             "recording counted; the weights' copy to the GPU, the same for every way, is not):", "",
             "| new tokens | " + " | ".join(WAYS) + " |", "|---|---|---|---|"]
    lengths = sorted({int(m.split()[0]) for s, m in run if s == "ZeroGPU worker" and m.split()[0].isdigit()})
    for n in lengths:
        eager = float(value(run, "ZeroGPU worker", f"{n} tokens: {WAYS[0]}"))
        cells = [f"{eager:g}"] + [f"{float(value(run, 'ZeroGPU worker', f'{n} tokens: {w}')):g} "
                                  f"({float(value(run, 'ZeroGPU worker', f'{n} tokens: {w}')) / eager:.2f}×)" for w in WAYS[1:]]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    before, after = (float(value(run, "8B AR before/after", m)) for m in (BEFORE, AFTER))
    verify = [float(x) for x in value(run, "8B verify cost", "graphs on: ms for 1, 2, 3, 4, 6, 8, 16, 32, 64 fed tokens").split()]
    split = [float(x) for x in value(run, "8B speculative step",
                                       f"EAGLE-3 head γ={GAMMA}, head as graphs: draft / verify / overhead / total per step").split(" / ")]
    t1, ratio = verify[0], verify[3] / verify[0]  # 4 fed rows: the last token and γ = 3 drafts
    c, overhead = split[0] / GAMMA / t1, split[2] / t1
    lines += ["", "A call in a fresh worker records its graphs (the second column); a worker that ZeroGPU reuses for the next "
              "call keeps them, and that call replays them (the last column: `specviz/models/backends/kept.py`). In the same run, "
              f"with graphs recorded in each run, the lean forward's decoder layers of commit {BEFORE_COMMIT} ran {before:g} tok/s "
              f"at 64 tokens and those of the run's own commit {after:g} ({of_limit(run, BEFORE)} → {of_limit(run, AFTER)} of the limit).",
              "",
              f"**Speculation with the EAGLE-3 head.** Its drafting, recorded as graphs, took {split[0]:g} ms per step at "
              f"γ = {GAMMA} (c = {c:.3f} of a one-token step of {t1:g} ms per drafted token), a verify of {GAMMA + 1} rows cost "
              f"{ratio:.2f}× a one-token step and the rest of the step {split[2]:g} ms. The head's acceptance on real text has not "
              "been measured here (the weights are random), so the expected speedup over AR is given per acceptance rate α with "
              "the cost model (`specviz/analysis/cost_model.py`): speedup = E(α, γ) ÷ (γ·c + T(γ+1)/T(1) + overhead/T(1)), E the "
              "expected tokens per step, T(k) the cost of a verify of k rows:", "",
              "| α | tokens per step | expected speedup over AR | expected tok/s (AR at " + f"{after:g})" + " |", "|---|---|---|---|"]
    for alpha in ALPHAS:
        e = expected_tokens_by_depth([alpha] * GAMMA, GAMMA)
        speedup = e / (GAMMA * c + ratio + overhead)
        lines.append(f"| {alpha:g} | {e:.2f} | {speedup:.2f}× | {speedup * after:.0f} |")
    lines += ["", f"A ZeroGPU card is not this {gpu}: scale the tok/s by the card's memory bandwidth over this one's (both AR "
              "and speculation are bound by reading the weights), and keep the ratios."]
    return "\n".join(lines)


def rendered(doc: Path) -> tuple[str, str]:
    """``doc``'s text, and that text with its block rendered from the results."""
    text = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + r"\n(?:.*?\n)?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc}: no {BEGIN} … {END} block")
    return text, pattern.sub(lambda _: f"{BEGIN}\n{block()}\n{END}", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/spaces.md's block differs from the results")
    ap.add_argument("--doc", type=Path, default=DOC, help=argparse.SUPPRESS)
    a = ap.parse_args()
    text, new = rendered(a.doc)
    if a.check:
        if new != text:
            raise SystemExit(f"{a.doc}: the ZeroGPU block differs from the results; run python scripts/render_zerogpu.py")
        return
    a.doc.write_text(new)


if __name__ == "__main__":
    main()
