"""Render the benchmark tables of README.md and docs/*.md from the committed results/*.csv.

A table sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``; TABLES below says which CSV, rows and
columns NAME shows. Speedups are medians of per-prompt ratios to the reference row (the first of the table's rows
unless ``ref`` says otherwise), as in results/*.md; "summed" is all tokens over all time of a row against its reference.

    python scripts/render_tables.py          # rewrite the tables in place
    python scripts/render_tables.py --check  # exit 1, naming the file, if a committed table differs from the CSVs
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_steps import benchmark_steps, made_by  # noqa: E402

sys.path.insert(0, str(ROOT))
from specviz.bench.report import MODEL_TOLERANCE, model_error  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAN = float("nan")
NUMBERS = ("new_tokens", "wall_s", "tokens_per_s", "speedup", "mean_accept_len", "accept_rate", "draft_ms", "verify_ms",
           "overhead_ms", "engine_overhead_frac", "predicted_tokens_per_s", "decode_tokens_per_s", "target_logprob",
           "model_speedup")


def load(name: str) -> list[dict]:
    """Rows of results/NAME.csv with numbers, JSON columns and booleans parsed; ``key`` identifies the prompt."""
    with open(ROOT / "results" / f"{name}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in NUMBERS:
            if k in r:
                r[k] = float(r[k]) if r[k] else NAN
        for k in ("per_position_accept", "levels"):
            if k in r:
                r[k] = json.loads(r[k])
        r["same"] = r.get("same_tokens_as_ar", r.get("same_tokens_as_hf_ar")) == "True"
        r["correct"] = r.get("correct") == "True"
        r["key"] = r.get("prompt_id") or f"{r.get('dtype')}/{r.get('prompt')}"
    return rows


def mean(values) -> float:
    values = [v for v in values if v == v]
    return statistics.mean(values) if values else NAN


def rate(rs: list[dict]) -> float:
    return sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)


def ratios(rs: list[dict], ref: list[dict], value=lambda r: r["tokens_per_s"]) -> list[float]:
    """Per prompt: the row's value over the reference row's on the same prompt."""
    by_key = {r["key"]: value(r) for r in ref}
    return [value(r) / by_key[r["key"]] for r in rs if r["key"] in by_key]


def positions(rs: list[dict]) -> str:
    width = max(len(r["per_position_accept"]) for r in rs)
    return " ".join(f"{mean(p[i] for r in rs if len(p := r['per_position_accept']) > i):.2f}" for i in range(width))


def split(rs: list[dict]) -> str:
    total = sum(r["draft_ms"] + r["verify_ms"] + r["overhead_ms"] for r in rs)
    return "/".join(f"{100 * sum(r[k] for r in rs) / total:.0f}" for k in ("draft_ms", "verify_ms", "overhead_ms")) if total else "–"


def level(r: dict, index: int, key: str) -> float:
    levels = r["levels"]
    return levels[index][key] if len(levels) > abs(index) and key in levels[index] else NAN


def theory_errors(rs: list[dict]) -> list[float]:
    return [100 * abs(r["predicted_tokens_per_s"] / r["decode_tokens_per_s"] - 1) for r in rs]


def accuracy(rs: list[dict]) -> float:
    return 100 * statistics.mean(r["correct"] for r in rs)


# column: (header, value of (rows of one config, rows of the reference config), format)
COLUMNS = {
    "config": ("config", lambda rs, ref: rs[0]["config"], "{}"),
    "tok_s": ("tok/s (median)", lambda rs, ref: statistics.median(r["tokens_per_s"] for r in rs), "{:.1f}"),
    "speedup": ("speedup vs {ref} (median per prompt)", lambda rs, ref: statistics.median(ratios(rs, ref)), "{:.2f}×"),
    "summed": ("summed tok/s vs {ref}", lambda rs, ref: rate(rs) / rate(ref), "{:.2f}×"),
    "accept_len": ("mean accepted len", lambda rs, ref: mean(r["mean_accept_len"] for r in rs), "{:.2f}"),
    "accept_rate": ("accept rate", lambda rs, ref: mean(r["accept_rate"] for r in rs), "{:.2f}"),
    "positions": ("per-position accept", lambda rs, ref: positions(rs), "{}"),
    "split": ("draft/verify/other %", lambda rs, ref: split(rs), "{}"),
    "overhead": ("engine overhead % (median)", lambda rs, ref: 100 * statistics.median(r["engine_overhead_frac"] for r in rs), "{:.1f}"),
    "same": ("same tokens as AR", lambda rs, ref: f"{sum(r['same'] for r in rs)}/{len(rs)}", "{}"),
    "target_ms": ("target ms per forward (mean)", lambda rs, ref: mean(level(r, 0, "T_ms") for r in rs), "{:.1f}"),
    "verify_cost": ("target forward ÷ {ref}'s (median per prompt)",
                    lambda rs, ref: statistics.median(ratios(rs, ref, lambda r: level(r, 0, "T_ms"))), "{:.2f}"),
    "draft_ms": ("draft ms per forward (mean)", lambda rs, ref: mean(level(r, -1, "T_ms") if len(r["levels"]) > 1 else NAN
                                                                     for r in rs), "{:.2f}"),
    "L1": ("target L_1 (mean)", lambda rs, ref: mean(level(r, 0, "L") for r in rs), "{:.2f}"),
    "predicted": ("Lemma 3.1 tok/s (median)", lambda rs, ref: statistics.median(r["predicted_tokens_per_s"] for r in rs), "{:.1f}"),
    "measured": ("measured decode tok/s (median)", lambda rs, ref: statistics.median(r["decode_tokens_per_s"] for r in rs), "{:.1f}"),
    "max_error": ("largest prediction error %", lambda rs, ref: max(theory_errors(rs)), "{:.1f}"),
    "len_vs_ref": ("accepted len ÷ {ref}", lambda rs, ref: mean(r["mean_accept_len"] for r in rs) / mean(r["mean_accept_len"] for r in ref),
                   "{:.2f}×"),
    "accuracy": ("accuracy %", lambda rs, ref: accuracy(rs), "{:.1f}"),
    "model": ("cost model's speedup (median)", lambda rs, ref: statistics.median(r["model_speedup"] for r in rs), "{:.2f}×"),
    "model_error": ("measured ÷ predicted − 1 (median)", lambda rs, ref: 100 * statistics.median(map(model_error, rs)), "{:+.1f} %"),
    "model_within": (f"prompts within {MODEL_TOLERANCE:.0%}".replace("%", " %"),
                     lambda rs, ref: f"{sum(abs(model_error(r)) <= MODEL_TOLERANCE for r in rs)}/{len(rs)}", "{}"),
    "delta": ("Δ accuracy vs {ref} (points)", lambda rs, ref: accuracy(rs) - accuracy(ref), "{:+.1f}"),
    "loglik": ("target log-lik / token", lambda rs, ref: mean(r["target_logprob"] for r in rs), "{:.2f}"),
}

DEFAULT_ROWS = ["head fixed γ=1", "head fixed γ=2", "head fixed γ=3", "head online from γ=1", "head online from γ=3",
                "head fsm from γ=3", "head hf-heuristic from γ=3", "head dynamic tree 4"]
"""The speculative rows of the defaults set (the model has nothing to predict for AR)."""
COST_MODEL_ROWS = ["head chain γ=4 (5 rows)", "head dynamic tree 8 (9 rows)", "head static tree 8 (9 rows)",
                   "head dynamic tree 12 (13 rows)", "draft-m chain γ=3 (4 rows)"]
MODEL = ["config", "model", "speedup", "model_error", "model_within"]
FULL = ["config", "tok_s", "speedup", "accept_len", "accept_rate", "positions", "split", "overhead", "same"]
SPEED = ["config", "speedup", "summed", "accept_len", "same"]
QUALITY = ["config", "accept_len", "len_vs_ref", "speedup", "accuracy", "delta", "loglik"]
ALL_PROMPT_ROWS = ["ar", "sd head γ=2", "sd head γ=3", "sd draft-m γ=3", "hf-assisted draft-m γ=3"]
SELECT = "online + select(head, draft-m, ngram)"
POLICY_PAIRS = [("online", "fixed γ=3"), ("online", "fixed γ=2"), ("online", "fixed γ=5"), ("online", "hf-heuristic"),
                ("fsm", "hf-heuristic")]
SELECTION_PAIRS = [(SELECT, "online head"), (SELECT, "online draft-m"), (SELECT, "online ngram")]
TREE_PAIRS = [(f"{d} {kind} tree 4 (5 rows)", f"{d} chain γ=4 (5 rows)") for d in ("head", "draft-m") for kind in ("dynamic", "static")]
"""Trees against chains that verify as many rows."""

TABLES = {
    "headline": dict(kind="summary", csv="defaults", rows=["ar", "head fixed γ=1", "head fixed γ=3", "head online from γ=1",
                                                           "head hf-heuristic from γ=3", "head dynamic tree 4"],
                     columns=["config", "tok_s", "speedup", "accept_len", "same"]),
    "all-prompts": dict(kind="summary", csv="bench_all_prompts", rows=ALL_PROMPT_ROWS, columns=FULL),
    "all-prompts-categories": dict(kind="categories", csv="bench_all_prompts", rows=ALL_PROMPT_ROWS),
    "all-prompts-peer": dict(kind="pairs", csv="bench_all_prompts", pairs=[("sd draft-m γ=3", "hf-assisted draft-m γ=3")]),
    "standard": dict(kind="summary", csv="bench", columns=FULL),
    "standard-peer": dict(kind="pairs", csv="bench", pairs=[
        ("sd draft-s γ=3", "hf-assisted draft-s γ=3"), ("sd draft-s γ=3, full draft vocab", "hf-assisted draft-s γ=3"),
        ("sd draft-m γ=3", "hf-assisted draft-m γ=3"), ("sd draft-m γ=3, full draft vocab", "hf-assisted draft-m γ=3")]),
    "standard-cost": dict(kind="summary", csv="bench", rows=[
        "ar", "sd draft-s γ=3", "sd draft-s γ=3, full draft vocab", "sd draft-m γ=3", "sd draft-m γ=3, full draft vocab",
        "sd ngram γ=3", "sd head γ=2", "sd head γ=3", "ar, bf16 target", "sd draft-m γ=3, bf16 target"],
        columns=["config", "target_ms", "verify_cost", "draft_ms", "accept_len", "split", "overhead"]),
    "heads": dict(kind="summary", csv="heads", columns=FULL),
    "heads-categories": dict(kind="categories", csv="heads"),
    "heads-peer": dict(kind="pairs", csv="heads", pairs=[(f"head γ={g}", f"head-v1 γ={g}") for g in range(1, 5)]),
    "policies": dict(kind="summary", csv="policies", columns=SPEED),
    "policies-pairs": dict(kind="pairs", csv="policies", pairs=POLICY_PAIRS),
    "policies-eagle3": dict(kind="summary", csv="policies_eagle3", columns=SPEED),
    "policies-eagle3-pairs": dict(kind="pairs", csv="policies_eagle3", pairs=POLICY_PAIRS),
    "selection": dict(kind="summary", csv="selection", columns=[*SPEED[:-1], "accept_rate", "same"]),
    "selection-eagle3": dict(kind="summary", csv="selection_eagle3", columns=[*SPEED[:-1], "accept_rate", "same"]),
    "selection-eagle3-pairs": dict(kind="pairs", csv="selection_eagle3", pairs=SELECTION_PAIRS),
    "selection-pairs": dict(kind="pairs", csv="selection", pairs=SELECTION_PAIRS),
    "selection-prompts": dict(kind="prompts", csv="selection", rows=["ar", "online head", SELECT]),
    "chains": dict(kind="summary", csv="chains",
                   columns=["config", "tok_s", "speedup", "L1", "predicted", "measured", "max_error", "same"]),
    "judge-paper-head": dict(kind="summary", csv="judge", columns=QUALITY),
    "judge-bundled": dict(kind="summary", csv="judge_confidence", columns=QUALITY),
    "judge-head-draft": dict(kind="summary", csv="judge_head_draft", columns=QUALITY),
    "trees": dict(kind="summary", csv="trees_all_prompts", columns=FULL),
    "defaults": dict(kind="summary", csv="defaults", columns=["config", "tok_s", "speedup", "accept_len", "split", "same"]),
    "defaults-categories": dict(kind="categories", csv="defaults"),
    "cost-model": dict(kind="summary", csv="cost_model", ref="ar", rows=COST_MODEL_ROWS, columns=MODEL),
    "cost-model-defaults": dict(kind="summary", csv="defaults", ref="ar", rows=DEFAULT_ROWS, columns=MODEL),
    "trees-pairs": dict(kind="pairs", csv="trees_all_prompts", pairs=TREE_PAIRS),
    "cuda-peer": dict(kind="pairs", csv="cuda/speed_bf16", accept=True, pairs=[
        ("engine ar", "hf generate (AR)"), ("engine sd early-4 γ=4", "hf-assisted early-4 γ=4"),
        ("engine sd draft-m γ=4", "hf-assisted draft-m γ=4"), ("engine sd draft-m γ=4, full draft vocab", "hf-assisted draft-m γ=4")]),
}


def fmt(value, spec: str) -> str:
    return "–" if isinstance(value, float) and value != value else spec.format(value)


def markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def of(rows: list[dict], config: str) -> list[dict]:
    found = [r for r in rows if r["config"] == config]
    if not found:
        raise SystemExit(f"render_tables: no row '{config}' in the CSV")
    return found


def render(spec: dict) -> str:
    rows = load(spec["csv"])
    labels = spec.get("rows") or list(dict.fromkeys(r["config"] for r in rows))
    ref_label = spec.get("ref", labels[0])
    ref = of(rows, ref_label)
    name = "AR" if ref_label == "ar" else ref_label
    if spec["kind"] == "summary":
        cols = [COLUMNS[c] for c in spec["columns"]]
        body = [[fmt(fn(of(rows, label), ref), f) for _, fn, f in cols] for label in labels]
        return markdown([h.format(ref=name) for h, _, _ in cols], body)
    if spec["kind"] == "pairs":
        header = ["row", "against", "median per prompt", "min", "max", "faster on", "summed"]
        body = []
        for a, b in spec["pairs"]:
            ra, rb = of(rows, a), of(rows, b)
            x = ratios(ra, rb)
            cells = [a, b, *(f"{v:.3f}×" for v in (statistics.median(x), min(x), max(x))),
                     f"{sum(v > 1 for v in x)} of {len(x)}", f"{rate(ra) / rate(rb):.3f}×"]
            body.append(cells + ([fmt(mean(r["accept_rate"] for r in ra), "{:.2f}")] if spec.get("accept") else []))
        return markdown(header + (["accept rate of row"] if spec.get("accept") else []), body)
    if spec["kind"] == "categories":
        categories = sorted({r["category"] for r in rows})
        body = [[label, *(f"{statistics.median(ratios([r for r in of(rows, label) if r['category'] == c], ref)):.2f}×"
                          for c in categories), f"{statistics.median(ratios(of(rows, label), ref)):.2f}×"] for label in labels[1:]]
        return markdown(["config", *categories, "all"], body)
    if spec["kind"] == "prompts":
        a, b = of(rows, labels[1]), of(rows, labels[2])
        ref_tps, b_tps = {r["key"]: r["tokens_per_s"] for r in ref}, {r["key"]: r["tokens_per_s"] for r in b}
        body = [[r["key"], f"{r['tokens_per_s'] / ref_tps[r['key']]:.2f}×", f"{b_tps[r['key']] / ref_tps[r['key']]:.2f}×",
                 f"{b_tps[r['key']] / r['tokens_per_s']:.3f}×"] for r in a]
        return markdown(["prompt", f"{labels[1]} vs {name}", f"{labels[2]} vs {name}", f"{labels[2]} ÷ {labels[1]}"], body)
    raise SystemExit(f"render_tables: unknown kind {spec['kind']!r}")


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def rewrite_blocks(text: str, path: Path, kind: str, blocks: Mapping[str, Callable[[], str]]) -> str:
    """``text`` with every block between ``<!-- KIND:NAME -->`` and ``<!-- /KIND:NAME -->`` replaced by
    ``blocks[NAME]()``; a SystemExit names the page for an unclosed or unknown block."""
    block = re.compile(rf"(<!-- {kind}:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /{kind}:(?P=name) -->)", re.S)
    opened = re.findall(rf"^<!-- {kind}:([\w-]+) -->$", text, re.M)
    if len(opened) != len(block.findall(text)):
        raise SystemExit(f"{shown(path)}: a {kind} marker is not closed ({kind}s: {', '.join(opened)})")

    def replace(m: re.Match) -> str:
        if m["name"] not in blocks:
            raise SystemExit(f"{shown(path)}: unknown {kind} '{m['name']}' (known: {', '.join(blocks)})")
        return f"{m[1]}\n{blocks[m['name']]()}\n{m[4]}"
    return block.sub(replace, text)


def render_pages(pages: list[Path], kind: str, blocks: Mapping[str, Callable[[], str]], check: bool, what: str) -> list[Path]:
    """Rewrite the ``kind`` blocks of every page (or, with ``check``, only report): the pages that differ."""
    stale = []
    for path in pages:
        text = path.read_text()
        new = rewrite_blocks(text, path, kind, blocks)
        if new != text:
            stale.append(path)
            if not check:
                path.write_text(new)
    for path in stale:
        print(f"{shown(path)}: {what} {'differ from' if check else 'rewritten from'} the source", file=sys.stderr)
    return stale


def table_block(spec: dict) -> str:
    csv_path = f"results/{spec['csv']}.csv"
    made = made_by(csv_path, *benchmark_steps())
    if made is None:
        raise SystemExit(f"render_tables: scripts/run_benchmarks.sh has no step or '# elsewhere:' line for {csv_path}")
    command, note = made
    return (f"{render(spec)}\n\n*From `{csv_path}` (made by `{command}`{'; ' + note if note else ''}), rendered by "
            "`scripts/render_tables.py`.*")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a committed table differs from the CSVs")
    args = ap.parse_args(argv)
    blocks = {name: (lambda spec=spec: table_block(spec)) for name, spec in TABLES.items()}
    stale = render_pages(PAGES, "table", blocks, args.check, "tables")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
