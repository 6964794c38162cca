"""A finished run as the CLI's JSON object: text, token ids, settings, metrics, per-step events and theory."""

from __future__ import annotations

from specviz.analysis.theory import run_theory
from specviz.core.metrics import summarize
from specviz.core.record import StepEvent
from specviz.runtime.prepare import PreparedRun, RunPlan


def result_of(plan: RunPlan, events: list[StepEvent]) -> dict:
    """The CLI's JSON object of a run's events."""
    token_ids = [t for e in events for t in e.emitted_ids]
    return {
        "text": plan.tokenizer.decode(token_ids, skip_special_tokens=True),
        "token_ids": token_ids,
        "config": plan.config.to_dict(),
        "metrics": summarize(events),
        "steps": [e.to_dict() for e in events],
        "theory": run_theory(events),
    }


def run_to_result(run: PreparedRun, events: list[StepEvent] | None = None) -> dict:
    """Decode to the end (unless ``events`` are given) and build the CLI's JSON object."""
    return result_of(run.plan, list(run.events()) if events is None else events)
