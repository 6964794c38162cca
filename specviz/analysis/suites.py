"""The evaluation prompt suites (``assets/prompts``), the judge's held-out verifiable questions, and the
warm-up prompts the acceptance predictor is fitted on (``assets/prompts/warmup``: same categories and style
as the suites, other texts).

Training recipes (draft distillation) must never use the evaluation texts nor the warm-up prompts: see
:func:`evaluation_texts`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from specviz.models.paths import ASSETS

PROMPTS = ASSETS / "prompts"
EVAL_QUESTIONS = ASSETS / "judge" / "eval_questions.jsonl"
WARMUP = PROMPTS / "warmup" / "warmup.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_suite(suite: str = "all", per_category: int = 0) -> list[dict]:
    """Prompts of the evaluation suites: all categories, a comma-separated subset, or ``judge-eval`` (the
    held-out verifiable questions, with their expected answers)."""
    if suite == "judge-eval":
        rows = _rows(EVAL_QUESTIONS)
        if per_category:
            rows = [r for i, r in enumerate(rows) if sum(x["category"] == r["category"] for x in rows[:i]) < per_category]
        return [{**r, "prompt": r["question"]} for r in rows]
    wanted = None if suite == "all" else set(suite.split(","))
    items = []
    for f in sorted(PROMPTS.glob("*.jsonl")):
        if wanted is None or f.stem in wanted:
            rows = _rows(f)
            items += rows[:per_category] if per_category else rows
    return items


def load_warmup(n: int = 0) -> list[dict]:
    """The first ``n`` warm-up prompts (all when 0), taken round-robin over the categories."""
    seen: dict[str, int] = {}
    ranked = []  # (index within its category, row): sorting on it deals the categories out in turn
    for row in _rows(WARMUP):
        ranked.append((seen.get(row["category"], 0), row))
        seen[row["category"]] = ranked[-1][0] + 1
    rows = [row for _, row in sorted(ranked, key=lambda pair: pair[0])]
    return rows[:n] if n else rows


def evaluation_texts() -> frozenset[str]:
    """Every prompt of every suite and every warm-up prompt, stripped: what a training recipe must leave out
    (a draft trained on the warm-up prompts would look better on them than on new text)."""
    texts = [item["prompt"] for suite in ("all", "judge-eval") for item in load_suite(suite)]
    return frozenset(t.strip() for t in texts + [item["prompt"] for item in load_warmup()])


def typical_prompt(rows: list[dict], config: str) -> str:
    """The typical prompt of a benchmark for row ``config`` (rows of its CSV: ``prompt_id``, ``category``, ``config``,
    ``speedup``): in the category whose median speedup is nearest the median over all prompts, the prompt whose speedup
    is nearest that category's median."""
    mine = [r for r in rows if r["config"] == config]
    overall = statistics.median(float(r["speedup"]) for r in mine)
    by_category: dict[str, list[dict]] = {}
    for r in mine:
        by_category.setdefault(r["category"], []).append(r)
    medians = {c: statistics.median(float(r["speedup"]) for r in rs) for c, rs in by_category.items()}
    category = min(sorted(medians), key=lambda c: abs(medians[c] - overall))
    return min(by_category[category], key=lambda r: (abs(float(r["speedup"]) - medians[category]), r["prompt_id"]))["prompt_id"]
