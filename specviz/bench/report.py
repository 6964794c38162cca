"""The benchmark's report: per-configuration tables (speed, peers, theory, cost model) over the rows of a run, and
the CSV, markdown and SVG files written from them."""

from __future__ import annotations

import csv
import json
import platform
import statistics
import time
from pathlib import Path

from specviz.analysis.quality import quality_table, speed_quality_svg
from specviz.analysis.theory import insertion_helps
from specviz.bench.configs import BenchConfig

SPLIT = ("draft_ms", "verify_ms", "overhead_ms")


def theory_columns(theory: dict | None) -> dict:
    """Lemma 3.1's prediction and the per-level T_i (ms) and L_i of one run, for the CSV."""
    if not theory:
        return {"predicted_tokens_per_s": float("nan"), "decode_tokens_per_s": float("nan"), "levels": "[]"}
    levels = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in lv.items()} for lv in theory["levels"]]
    return {"predicted_tokens_per_s": round(theory["predicted_tokens_per_s"] or float("nan"), 3),
            "decode_tokens_per_s": round(theory["measured_tokens_per_s"] or float("nan"), 3), "levels": json.dumps(levels)}


MODEL_TOLERANCE = 0.15
"""How far a prompt's measured speedup may be from the cost model's prediction and still count as predicted."""


def model_error(row: dict) -> float:
    """A row's measured speedup over the cost model's prediction, minus 1."""
    return row["speedup"] / row["model_speedup"] - 1


def model_table(rows: list[dict], labels: list[str], tolerance: float = MODEL_TOLERANCE) -> list[dict]:
    """Per speculative configuration: the cost model's predicted speedup against the measured one (medians over
    prompts), the median per-prompt error and the share of prompts whose measured speedup is within ``tolerance``."""
    out = []
    for label in labels:
        rs = [r for r in rows if r["config"] == label and r.get("model_speedup", float("nan")) == r.get("model_speedup")]
        if not rs:
            continue
        errors = [model_error(r) for r in rs]
        out.append({"config": label, "predicted speedup": statistics.median(r["model_speedup"] for r in rs),
                    "measured speedup": statistics.median(r["speedup"] for r in rs),
                    "median error %": 100 * statistics.median(errors),
                    f"prompts within {tolerance:.0%}": f"{sum(abs(e) <= tolerance for e in errors)}/{len(rs)}"})
    return out


def theory_table(rows: list[dict], labels: list[str]) -> list[dict]:
    """Per configuration: Lemma 3.1's predicted against the measured decode tok/s, and the mean T_i / L_i."""
    out = []
    for label in labels:
        rs = [r for r in rows if r["config"] == label]
        levels = [json.loads(r["levels"]) for r in rs]
        names = [lv["name"] for lv in levels[0]]
        cells = []
        for i, name in enumerate(names):
            t = statistics.mean(lvs[i]["T_ms"] for lvs in levels)
            ell = [lvs[i].get("L") for lvs in levels if lvs[i].get("L") is not None]
            rest = f"L={statistics.mean(ell):.2f}" if ell else f"β={statistics.mean(lvs[i]['beta'] for lvs in levels):.1f}"
            cells.append(f"{name}: T={t:.1f} ms, {rest}")
        errors = [r["predicted_tokens_per_s"] / r["decode_tokens_per_s"] - 1 for r in rs]
        out.append({"config": label, "levels (mean T_i, L_i)": "; ".join(cells),
                    "predicted tok/s": statistics.median(r["predicted_tokens_per_s"] for r in rs),
                    "measured decode tok/s": statistics.median(r["decode_tokens_per_s"] for r in rs),
                    "median error %": 100 * statistics.median(errors), "max abs error %": 100 * max(abs(e) for e in errors)})
    return out


def _level_mean(runs: list[list[dict]], index: int, key: str) -> float:
    """Mean of one level's ``key`` over runs (each run's levels top first)."""
    return statistics.mean(levels[index][key] for levels in runs)


def insertion_table(rows: list[dict], configs: list[BenchConfig]) -> list[dict]:
    """Theorem 3.2 for every chain that extends a base row by one level: the verdict from mean T / L
    against the measured sign (median per-prompt tok/s ratio)."""
    out = []
    for cfg in configs:
        base = cfg.extra.get("base")
        if not base:
            continue
        new_rows = [r for r in rows if r["config"] == cfg.label]
        base_rows = {r["prompt_id"]: r for r in rows if r["config"] == base}
        new_levels = [json.loads(r["levels"]) for r in new_rows]
        base_names = [lv["name"] for lv in json.loads(next(iter(base_rows.values()))["levels"])]
        names = [lv["name"] for lv in new_levels[0]]
        i = next(k for k, name in enumerate(names) if name not in base_names)  # the inserted level
        l_before = statistics.mean(json.loads(base_rows[r["prompt_id"]]["levels"])[i - 1]["L"] for r in new_rows)
        t_new, t_i = _level_mean(new_levels, i, "T_ms"), _level_mean(new_levels, i - 1, "T_ms")
        l_new, l_after = _level_mean(new_levels, i, "L"), _level_mean(new_levels, i - 1, "L")
        helps = insertion_helps(t_new, t_i, l_new, l_before, l_after)
        ratio = statistics.median(r["tokens_per_s"] / base_rows[r["prompt_id"]]["tokens_per_s"] for r in new_rows)
        out.append({"insertion": f"{names[i]} below {names[i - 1]} ({base} → {cfg.label})", "T_new/T_i": t_new / t_i,
                    "L_new": l_new, "L_i before": l_before, "L_i after": l_after,
                    "rhs L_new(1/L_i − 1/L_i′)": l_new * (1 / l_before - 1 / l_after),
                    "Theorem 3.2 says": "helps" if helps else "hurts", "measured tok/s ratio": ratio,
                    "agrees": "yes" if helps == (ratio > 1) else "NO"})
    return out


def summary_table(rows: list[dict], labels: list[str]) -> list[dict]:
    out = []
    for label in labels:
        rs = [r for r in rows if r["config"] == label]
        drafted = [r for r in rs if r["accept_rate"] == r["accept_rate"]]
        time_total = sum(r["draft_ms"] + r["verify_ms"] + r["overhead_ms"] for r in rs) or 1.0
        positions = [json.loads(r["per_position_accept"]) for r in rs]
        width = max((len(p) for p in positions), default=0)
        timed = any(r["verify_ms"] for r in rs)  # transformers' assisted rows have no phase timers
        out.append({
            "config": label,
            "tok/s (median)": statistics.median(r["tokens_per_s"] for r in rs),
            "tok/s (total)": sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs),
            f"speedup vs {labels[0]} (median)": statistics.median(r["speedup"] for r in rs),
            "mean accepted len": statistics.mean(r["mean_accept_len"] for r in drafted) if drafted else float("nan"),
            "accept rate": statistics.mean(r["accept_rate"] for r in drafted) if drafted else float("nan"),
            "per-position accept": " ".join(f"{statistics.mean(p[i] for p in positions if len(p) > i):.2f}" for i in range(width)),
            "draft/verify/other %": "/".join(f"{100 * sum(r[k] for r in rs) / time_total:.0f}" for k in SPLIT) if timed else "n/a",
            "engine overhead %": 100 * statistics.median(r["engine_overhead_frac"] for r in rs) if timed else float("nan"),
            "same tokens as AR": f"{sum(r['same_tokens_as_ar'] for r in rs)}/{len(rs)}",
        })
    return out


def peer_table(rows: list[dict], configs: list[BenchConfig]) -> list[dict]:
    """Each engine row against its peer: transformers' assisted generation with the same target, draft, γ and dtype,
    or the row its ``extra["peer"]`` names; the per-prompt tok/s ratio (median, min, max)."""
    def pair(c: BenchConfig) -> tuple:
        return c.decode.draft, c.decode.gamma, c.decode.gamma_policy, c.decode.dtype

    pairs = [(cfg.label, peer.label) for peer in configs if peer.transformers and peer.decode.method == "sd"
             for cfg in configs if not cfg.transformers and cfg.decode.method == "sd" and pair(cfg) == pair(peer)]
    pairs += [(cfg.label, cfg.extra["peer"]) for cfg in configs if "peer" in cfg.extra]
    tps = {(r["config"], r["prompt_id"]): r["tokens_per_s"] for r in rows}
    out = []
    for row, peer in pairs:
        ratios = [v / tps[(peer, pid)] for (label, pid), v in tps.items() if label == row]
        out.append({"engine row": row, "peer": peer, "engine / peer (median)": statistics.median(ratios),
                    "min": min(ratios), "max": max(ratios), "prompts": len(ratios)})
    return out


def markdown(table: list[dict]) -> str:
    cols = list(table[0])
    fmt = (lambda v: f"{v:.2f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in table]
    return "\n".join(lines)


def write_results(rows: list[dict], configs: list[BenchConfig], out: Path, max_new_tokens: int, machine: str = "",
                  repeats: int = 1) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    labels = [c.label for c in configs]
    categories = sorted({r["category"] for r in rows})
    parts = [f"# Benchmark ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine or platform.machine()}. Greedy, {max_new_tokens} new tokens, "
             f"{len(rows) // len(labels)} prompts, configurations interleaved per prompt (rotated order) after a warm-up"
             + (f"; each row is the fastest of {repeats} interleaved rounds." if repeats > 1 else "."),
             "Speedup = median over prompts of (tok/s of the row) / (tok/s of AR on the same prompt); tok/s (total) = "
             "every prompt's new tokens over every prompt's wall time, which one noisy prompt moves less than a median of "
             "few prompts can.", "",
             "## Overall", "", markdown(summary_table(rows, labels)), ""]
    if peers := peer_table(rows, configs):
        parts += ["## Rows against their peers", "",
                  "Per-prompt tok/s ratio of each row to its peer: `generate(assistant_model=...)` on the same target, "
                  "draft and γ, or the row named.", "", markdown(peers), ""]
    if all(c.quality for c in configs):
        table = quality_table(rows, labels)
        out.with_suffix(".svg").write_text(speed_quality_svg(table))
        parts += ["## Speed and quality", "", f"Quality on the held-out verifiable questions ({len(rows) // len(labels)}); "
                  "accuracy = the expected answer is the last number (or a whole word) of the output; log-likelihood = the "
                  "target's mean log p per output token. Exact greedy SD is lossless: its outputs are the target's own.", "",
                  markdown(table), "",
                  f"![speed against quality]({out.with_suffix('.svg').name})", ""]
    if any(c.decode.chain for c in configs):
        parts += ["## Theory (Lemma 3.1) against measurement", "",
                  "Predicted tok/s from each run's own per-forward times T_i and acceptance lengths L_i; measured = "
                  "decode tok/s of the same run (prefill excluded on both sides).", "",
                  markdown(theory_table(rows, labels)), "", "## Insertions (Theorem 3.2)", "",
                  markdown(insertion_table(rows, configs)), ""]
    if model := model_table(rows, labels):
        parts += ["## Cost model against measurement", "",
                  "Predicted speedup = E[tokens per step] / (γ·c + T(k)/T(1)) per step (`specviz/analysis/cost_model.py`): "
                  "E from the run's per-depth acceptance, c its draft ms per token, T(k) its verify ms per forward of k "
                  "rows, T(1) the AR run's on the same prompt. Measured = the tok/s ratio above (prefill and engine "
                  "overhead included, which the model leaves out). Error = measured / predicted − 1.", "",
                  markdown(model), ""]
    for cat in categories:
        parts += [f"## {cat}", "", markdown(summary_table([r for r in rows if r["category"] == cat], labels)), ""]
    out.with_suffix(".md").write_text("\n".join(parts))
