"""Run-level numbers from a stream of StepEvents (vLLM's definitions of accept length and rate)."""

from __future__ import annotations

from collections.abc import Sequence

from specviz.core.record import SPANS
from specviz.core.tree import depths

METRICS = {
    "new_tokens": "tokens emitted",
    "wall_s": "seconds from the start of the run (prefill included) to its last step",
    "tokens_per_s": "new_tokens ÷ wall_s",
    "target_forwards": "steps: one target forward each",
    "mean_accept_len": "emitted tokens per target forward",
    "accept_rate": "accepted ÷ drafted",
    "drafted": "draft tokens proposed",
    "accepted": "draft tokens kept",
    "per_position_accept": "P(position i accepted | drafted), i = 1 … the longest draft (a tree: by depth)",
    "draft_ms": "total time drafting (the steps' drafting spans)",
    "verify_ms": "total time verifying (their verifying spans: the forwards and the acceptance tests)",
    "overhead_ms": "total time in the steps' other spans (deciding, committing, recording)",
    "spans_ms": "the steps' time per span (`deciding`, `drafting`, `verifying`, `committing`, `recording`), summed",
    "prefill_ms": "time before the first step: the prompt's prefill",
    "outside_ms": "time between steps, outside the engine (the caller's: a view drawing a step, a benchmark's bookkeeping)",
    "engine_overhead_frac": "the share of step time outside model forwards",
}
"""The keys of :func:`summarize`, with what each holds."""


def summarize(events: Sequence) -> dict:
    """new tokens, wall time, tokens/s, target forwards, mean accepted length, acceptance rate,
    per-position acceptance and the draft / verify / overhead split."""
    new_tokens = sum(len(e.emitted_ids) for e in events)
    wall_s = events[-1].elapsed_ms / 1e3 if events else 0.0
    drafted = sum(len(e.draft_ids) for e in events)
    accepted = sum(e.accepted for e in events)
    step_ms = sum(e.total_ms for e in events)
    forward_ms = sum(e.forward_ms for e in events)
    spans = {k: sum(e.spans[k] for e in events) for k in SPANS}
    prefill_ms = events[0].elapsed_ms - events[0].total_ms if events else 0.0
    return {
        "new_tokens": new_tokens,
        "wall_s": wall_s,
        "tokens_per_s": new_tokens / wall_s if wall_s > 0 else 0.0,
        "target_forwards": len(events),
        "mean_accept_len": new_tokens / len(events) if events else 0.0,
        "accept_rate": accepted / drafted if drafted else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "per_position_accept": per_position_acceptance(events),
        "draft_ms": spans["drafting"],
        "verify_ms": spans["verifying"],
        "overhead_ms": spans["deciding"] + spans["committing"] + spans["recording"],
        "spans_ms": spans,
        "prefill_ms": prefill_ms,
        "outside_ms": wall_s * 1e3 - prefill_ms - step_ms,
        "engine_overhead_frac": (step_ms - forward_ms) / step_ms if step_ms else 0.0,
    }


def per_position_acceptance(events: Sequence) -> list[float]:
    """P(draft position i accepted | position i was drafted), i = 1..max γ; for a token tree, position = depth."""
    reach = [max(depths(e.tree.parents), default=0) if e.tree else len(e.draft_ids) for e in events]
    width = max(reach, default=0)
    hits, tries = [0] * width, [0] * width
    for e, deep in zip(events, reach):
        for i in range(deep):
            tries[i] += 1
            hits[i] += i < e.accepted
    return [h / t if t else 0.0 for h, t in zip(hits, tries)]
