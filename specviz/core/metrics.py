"""Run-level numbers from a stream of StepEvents (vLLM's definitions of accept length and rate)."""

from __future__ import annotations

from collections.abc import Sequence

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
    "draft_ms": "total time drafting",
    "verify_ms": "total time verifying",
    "overhead_ms": "total time in the rest of the steps",
    "prefill_ms": "time before the first step",
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
        "draft_ms": sum(e.draft_ms for e in events),
        "verify_ms": sum(e.verify_ms for e in events),
        "overhead_ms": sum(e.overhead_ms for e in events),
        "prefill_ms": wall_s * 1e3 - step_ms,
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
