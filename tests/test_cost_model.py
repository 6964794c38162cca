"""The cost model: the verify's measured cost, per-depth acceptance for chains and trees, and the run's prediction."""

import json

import pytest

from specviz.analysis.cost_model import (
    FREE,
    StepShape,
    VerifyCost,
    expected_tokens_by_depth,
    per_depth_acceptance,
    predict_run,
    profile_from_bench,
)
from specviz.core.formulas import best_gamma, expected_tokens, speedup


def chain_step(drafted: int, accepted: int, draft_ms: float = 2.0, verify_ms: float = 10.0) -> dict:
    return {"draft_ids": [1] * drafted, "accepted": accepted, "tree": None, "spans": {"drafting": draft_ms, "verifying": verify_ms}}


def tree_step(depths: list[int], accepted: int, draft_ms: float = 4.0, verify_ms: float = 20.0) -> dict:
    nodes = [{"depth": d} for d in depths]
    return {"draft_ids": [1] * len(depths), "accepted": accepted, "tree": {"nodes": nodes},
            "spans": {"drafting": draft_ms, "verifying": verify_ms}}


def test_verify_cost_interpolates_between_measured_row_counts_and_extends_the_last_segment():
    r = VerifyCost({2: 1.1, 4: 1.5, 8: 2.3})
    assert r(1) == 1.0 and r(2) == 1.1 and r(3) == pytest.approx(1.3) and r(6) == pytest.approx(1.9)
    assert r(10) == pytest.approx(2.7)  # 2.3 + 0.2 per row
    assert VerifyCost({3: 0.9, 5: 0.8})(9) == pytest.approx(0.8)  # never cheaper past the last point
    assert FREE(17) == 1.0
    committed = VerifyCost.load()
    assert committed.source and all(k > 1 and r > 0 for k, r in committed.points.items())


def test_the_verify_cost_enters_the_speedup_and_moves_the_best_gamma():
    assert speedup(0.8, 0.05, 4) == pytest.approx(expected_tokens(0.8, 4) / 1.2)
    assert speedup(0.8, 0.05, 4, verify=2.0) == pytest.approx(expected_tokens(0.8, 4) / 2.2)
    cliff = VerifyCost({2: 1.0, 4: 1.05, 5: 2.0})
    assert best_gamma(0.6, 0.02, 12) > 3 and best_gamma(0.6, 0.02, 12, cliff) == 3


def test_per_depth_acceptance_reduces_to_the_iid_formula_and_reads_trees_by_depth():
    a = 0.6
    assert expected_tokens_by_depth([a] * 5, 5) == pytest.approx(expected_tokens(a, 5))
    assert expected_tokens_by_depth([0.5, 0.5, 0.5], 1) == 1.5
    steps = [StepShape.of(chain_step(3, k)) for k in (0, 1, 3, 3)]
    # depth 1: 3 of 4 accepted; depth 2: of the 3 that accepted depth 1, 2 accepted; depth 3: 2 of 2
    assert per_depth_acceptance(steps) == pytest.approx([0.75, 2 / 3, 1.0])
    tree = StepShape.of(tree_step([1, 1, 2, 3, 2], 2))
    assert (tree.rows, tree.depth, tree.accepted) == (6, 3, 2)


def test_a_run_is_predicted_from_its_own_acceptance_and_costs():
    events = [chain_step(3, 3), chain_step(3, 0), chain_step(3, 1)]
    p = predict_run(events, t1_ms=8.0)
    a = per_depth_acceptance([StepShape.of(e) for e in events])
    tokens = expected_tokens_by_depth(a, 3)
    c = 6.0 / 9 / 8.0
    assert p["c"] == pytest.approx(c) and p["verify_ratio"] == {4: pytest.approx(10 / 8)}
    assert p["predicted_speedup"] == pytest.approx(tokens / (3 * c + 10 / 8))
    assert p["tokens_per_step"] == pytest.approx(tokens) and p["mean_rows"] == 4
    assert p["alpha"] == pytest.approx(4 / 6)  # 4 accepted, 2 rejections (the full draft ends without one)
    trees = predict_run([tree_step([1, 1, 2, 2], 2), tree_step([1, 2, 3, 3], 0)], t1_ms=10.0)
    assert trees["verify_ratio"] == {5: 2.0} and trees["per_depth_acceptance"] == [0.5, 1.0, 0.0]
    # without a baseline, r(k) comes from the profile and T(1) from the run's verify time through it
    profiled = predict_run(events, None, VerifyCost({4: 1.25}, "a profile"))
    assert profiled["t1_ms"] == pytest.approx(8.0) and profiled["verify_source"] == "a profile"
    assert profiled["predicted_speedup"] == pytest.approx(p["predicted_speedup"])
    assert predict_run([chain_step(0, 0)], 8.0) is None


def test_the_profile_is_the_median_verify_ratio_per_fed_row_count():
    def row(prompt, config, t):
        return {"prompt_id": prompt, "config": config, "levels": json.dumps([{"name": "target", "T_ms": t}])}

    rows = [row("a", "ar", 10.0), row("a", "x chain γ=1 (2 rows)", 11.0), row("a", "x dynamic tree 4 (5 rows)", 20.0),
            row("b", "ar", 20.0), row("b", "x chain γ=1 (2 rows)", 20.0), row("b", "x dynamic tree 4 (5 rows)", 44.0),
            row("b", "x online", 30.0)]
    profile = profile_from_bench(rows, "test")
    assert profile.points == {2: pytest.approx(1.05), 5: pytest.approx(2.1)} and profile.source == "test"
