"""Run-level metrics from hand-built StepEvents."""

import pytest

from specviz.core.metrics import per_position_acceptance, summarize
from specviz.core.record import StepEvent, TreeRecord


def event(draft_ids, accepted, emitted, elapsed_ms, draft_ms=0.0, verify_ms=0.0, overhead_ms=0.0, forward_ms=0.0):
    spans = {"deciding": overhead_ms / 2, "drafting": draft_ms, "verifying": verify_ms, "committing": overhead_ms / 4,
             "recording": overhead_ms / 4}
    return StepEvent(step=0, drafter="d", gamma=len(draft_ids), drafted=len(draft_ids), draft_ids=draft_ids,
                     draft_q=[1.0] * len(draft_ids), draft_p=[1.0] * len(draft_ids), accepted=accepted, emitted_ids=emitted,
                     emitted_p=[1.0] * len(emitted), accept_reasons=[], spans=spans,
                     total_ms=draft_ms + verify_ms + overhead_ms, forward_ms=forward_ms, elapsed_ms=elapsed_ms,
                     tree=TreeRecord.single_path(len(draft_ids), accepted))


EVENTS = [
    event([1, 2, 3, 4], 4, [1, 2, 3, 4, 5], 150.0, draft_ms=10, verify_ms=30, overhead_ms=2, forward_ms=36),
    event([6, 7, 8, 9], 1, [6, 0], 200.0, draft_ms=12, verify_ms=28, overhead_ms=4, forward_ms=38),
    event([3, 3], 0, [4], 240.0, draft_ms=5, verify_ms=30, overhead_ms=3, forward_ms=34),
    event([], 0, [8], 270.0, verify_ms=25, overhead_ms=5, forward_ms=25),  # a step that drafted nothing
]


def test_per_position_acceptance_by_hand():
    # position 1: drafted 3 times, accepted in steps 1 and 2; 2: 3 tries, 1 hit; 3 and 4: 2 tries (4-token drafts), 1 hit
    assert per_position_acceptance(EVENTS) == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert per_position_acceptance([]) == []
    assert per_position_acceptance([EVENTS[-1]]) == []


def test_summarize_by_hand():
    s = summarize(EVENTS)
    assert s["new_tokens"] == 9 and s["target_forwards"] == 4
    assert s["wall_s"] == pytest.approx(0.27) and s["tokens_per_s"] == pytest.approx(9 / 0.27)
    assert s["mean_accept_len"] == pytest.approx(9 / 4)
    assert s["drafted"] == 10 and s["accepted"] == 5 and s["accept_rate"] == pytest.approx(0.5)
    assert s["per_position_accept"] == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert (s["draft_ms"], s["verify_ms"], s["overhead_ms"]) == pytest.approx((27, 113, 14))
    step_ms = 27 + 113 + 14
    assert s["spans_ms"] == pytest.approx({"deciding": 7, "drafting": 27, "verifying": 113, "committing": 3.5, "recording": 3.5})
    assert s["prefill_ms"] == pytest.approx(150 - 42)  # before the first step ended, what that step does not account for
    assert s["outside_ms"] == pytest.approx(270 - 108 - step_ms)  # the time between steps
    assert s["engine_overhead_frac"] == pytest.approx((step_ms - (36 + 38 + 34 + 25)) / step_ms)


def test_summarize_of_autoregressive_steps():
    s = summarize([event([], 0, [t], 20.0 * (t + 1), verify_ms=15, forward_ms=15) for t in range(5)])
    assert s["mean_accept_len"] == 1.0 and s["accept_rate"] == 0.0 and s["drafted"] == 0
    assert s["per_position_accept"] == [] and s["engine_overhead_frac"] == 0.0
    assert s["tokens_per_s"] == pytest.approx(5 / 0.1) and s["prefill_ms"] == pytest.approx(20 - 15)
    assert s["outside_ms"] == pytest.approx(100 - 5 - 75)


def test_summarize_of_nothing_is_zeros():
    s = summarize([])
    assert s["new_tokens"] == 0 and s["wall_s"] == 0.0 and s["tokens_per_s"] == 0.0
    assert s["mean_accept_len"] == 0.0 and s["accept_rate"] == 0.0 and s["engine_overhead_frac"] == 0.0
    assert s["per_position_accept"] == []
