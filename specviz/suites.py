"""The evaluation prompt suites (``assets/prompts``) and the judge's held-out verifiable questions.

Training recipes (draft distillation, predictor warm-up) must never use these texts: see
:func:`evaluation_texts`."""

from __future__ import annotations

import json
from pathlib import Path

from .models import ASSETS

PROMPTS = ASSETS / "prompts"
EVAL_QUESTIONS = ASSETS / "judge" / "eval_questions.jsonl"


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


def evaluation_texts() -> frozenset[str]:
    """Every prompt of every suite, stripped: what a training recipe must leave out."""
    return frozenset(item["prompt"].strip() for suite in ("all", "judge-eval") for item in load_suite(suite))
