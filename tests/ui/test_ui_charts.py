"""Chart builders: every spec passes plotly's own validation, and the theory matches the standard formulas."""

import pickle

import plotly.graph_objects as go
import pytest

from specviz.analysis.cost_model import VerifyCost
from specviz.analysis.theory import run_theory
from specviz.ui.explain import measured_from, run_prediction, summary_markdown, theory_html, verify_cost
from specviz.ui.state import new_session
from specviz.viz import charts


def events(n=6, verify_ms=30.0):
    return [{"step": i, "emitted_ids": [1] * (1 + i % 3), "total_ms": 40.0 + i, "elapsed_ms": 100.0 + 45 * i, "gamma": 4,
             "draft_ids": [7] * (i % 5), "accepted": min(i % 3, i % 5),
             "spans": {"drafting": 2.0 * (i % 5), "verifying": verify_ms}} for i in range(1, n + 1)]


SPANS_MS = {"deciding": 1.0, "drafting": 2.0, "verifying": 260.0, "committing": 8.0, "recording": 3.0}
METRICS = {"per_position_accept": [0.8, 0.5, 0.2, 0.0], "prefill_ms": 90.0, "spans_ms": SPANS_MS, "outside_ms": 5.0, "tokens_per_s": 30.0}


def test_race_spec_is_valid_and_marks_the_baseline_without_colour_alone():
    spec = charts.race_spec([charts.Series("sd", [0, 0.1, 0.2], [0, 3, 5]), charts.Series("AR", [0, 0.1, 0.2], [0, 1, 2], True)])
    fig = go.Figure(spec)  # validates every property
    assert [t.name for t in fig.data] == ["sd", "AR"]
    assert fig.data[1].line.dash == "dash" and fig.data[0].line.dash == "solid"
    assert pickle.loads(pickle.dumps(charts.race_figure([]))) is not None


def test_dynamics_spec_is_valid_with_and_without_ar():
    ar_spans = {**SPANS_MS, "drafting": 0.0, "verifying": 400.0}
    for ar in (None, {"tokens_per_s": 20.0, "prefill_ms": 90.0, "outside_ms": 0.0, "spans_ms": ar_spans}):
        d = charts.dynamics_from_events(events(), METRICS, ar)
        fig = go.Figure(charts.dynamics_spec(d))
        names = {t.name for t in fig.data}
        assert {"accepted drafts", "drafted, not accepted", "γ budget", "P(accept | drafted)", "prefill", *SPANS_MS, "outside"} <= names
        assert ("AR baseline tok/s" in names) == (ar is not None)
    assert d.gammas == [4] * 6 and d.drafted == [1, 2, 3, 4, 0, 1] and d.tokens_per_s[0] == pytest.approx(2000 / 41)


def test_every_run_shows_its_drafts_kept_by_length_and_what_each_gamma_would_give():
    """Steps that drafted 1, 2, 3, 4 and 1 tokens and kept 1, 2, 0, 1 and 0: a histogram per draft length; the cost model
    at the measured per-depth acceptance (a_1 = 3/5 …) per γ, with a speedup only where the steps were timed."""
    ar = {"tokens_per_s": 20.0, "prefill_ms": 90.0, "outside_ms": 0.0, "spans_ms": SPANS_MS, "verify_ms": 300.0,
          "target_forwards": 10}
    timed, untimed = (charts.dynamics_from_events(events(verify_ms=v), METRICS, ar if v else None) for v in (30.0, 0.0))
    assert timed.lengths == {1: [1, 1], 2: [0, 0, 1], 3: [1, 0, 0, 0], 4: [0, 1, 0, 0, 0]}
    assert [row["gamma"] for row in timed.by_gamma] == [1, 2, 3, 4]
    assert timed.by_gamma[0]["tokens_per_step"] == pytest.approx(1.6) and untimed.by_gamma[0]["tokens_per_step"] == pytest.approx(1.6)
    c = sum(2.0 * (i % 5) for i in range(1, 7)) / 11 / 30.0  # draft ms per drafted token over T(1) = 300 / 10
    assert timed.by_gamma[0]["speedup"] == pytest.approx(1.6 / (c + 1.0))  # the run fed 2 rows at T(2) = T(1)
    assert all(row["speedup"] is None for row in untimed.by_gamma)
    names = {t.name for t in go.Figure(charts.dynamics_spec(timed)).data}
    assert {"drafted 1", "drafted 4", "tokens per step at γ", "predicted speedup at γ"} <= names
    assert "predicted speedup at γ" not in {t.name for t in go.Figure(charts.dynamics_spec(untimed)).data}


def test_theory_formula_matches_the_design():
    assert charts.expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert charts.expected_tokens(1.0, 4) == 5
    assert charts.speedup(0.8, 0.05, 4) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    for alpha in (0.1, 0.3, 0.6, 0.9):
        for c in (0.02, 0.2, 0.5, 0.95):
            assert (charts.best_gamma(alpha, c, 16) > 0) == (alpha > c)
    cliff = VerifyCost({2: 1.0, 5: 2.0})
    for measured in (charts.Measured(0.6, 0.03, 4, 2.2, 1.4, 1.5), charts.Measured(0.6, 0.03, 4, 2.2, None),
                     charts.Measured(0.6, 0.03, 8, 2.6, 1.1, 1.2, tree=True)):
        spec = charts.theory_spec(0.7, 0.05, 12, measured, cliff)
        go.Figure(spec)
        names = [t["name"] for t in spec["data"]]
        assert ("cost model's prediction (tree)" in names) == measured.tree and ("predicted from measured α=0.60" in names) != measured.tree
    curve = next(t for t in charts.theory_spec(0.7, 0.05, 12, None, cliff)["data"] if "measured T(k)/T(1)" in t["name"])
    assert curve["y"][4] == pytest.approx(charts.speedup(0.7, 0.05, 4, 2.0))
    go.Figure(charts.empty_figure("waiting"))


def test_explain_uses_only_real_measurements():
    session = new_session()
    assert measured_from(session, run_prediction(session)) is None and "none yet" in summary_markdown(0.7, 0.05, 12, None)
    assert "Run something in the Explore tab" in theory_html(session)
    spans = {"drafting": 2.0, "verifying": 55.0}
    steps = [{"gamma": 4, "draft_ids": [1] * 4, "accepted": k, "tree": None, "spans": spans} for k in (4, 1, 0)]
    session["last"] = {"config": {"method": "sd", "gamma": 4}, "run": 3, "speedup": 1.3, "theory": None,
                       "events": [*steps, {"gamma": 0, "draft_ids": [], "accepted": 0, "tree": None,
                                           "spans": {"drafting": 0.0, "verifying": 35.0}}],
                       "metrics": {"drafted": 12, "accept_rate": 5 / 12, "draft_ms": 6.0, "verify_ms": 200.0, "target_forwards": 4,
                                   "mean_accept_len": 2.0},
                       "ar": {"metrics": {"verify_ms": 500.0, "target_forwards": 10}}}
    prediction = run_prediction(session)
    m = measured_from(session, prediction)
    assert (m.alpha, m.c, m.gamma, m.speedup) == (5 / 7, pytest.approx(6.0 / 12 / 50), 3, 1.3)  # α: 5 accepted, 2 rejections
    assert prediction["verify_ratio"] == {1: pytest.approx(0.7), 5: pytest.approx(1.1)} and m.predicted == prediction["predicted_speedup"]
    shown = summary_markdown(0.7, 0.05, 12, m, verify_cost(prediction), prediction)
    assert "run #3" in shown and f"predicted **{m.predicted:.2f}×**" in shown and "r(5) = 1.10" in shown
    assert verify_cost(prediction)(5) == pytest.approx(1.1) and verify_cost(prediction)(3) == pytest.approx(1.05)  # the run's own r(k)
    session["last"]["theory"] = chain_theory()
    shown = theory_html(session)
    assert "Run #3" in shown and "Lemma 3.1 predicts" in shown and "Theorem 3.2" in shown and "Theorem 3.3" in shown
    assert all(name in shown for name in ("target", "mid", "ngram"))
    go.Figure(charts.length_distribution_spec(session["last"]["theory"]))


def chain_theory() -> dict:
    """The theory block of a hand-made three-level run (ngram → mid → target)."""
    from types import SimpleNamespace

    from specviz.core.record import LevelRecord

    def step(k: int, acc: int, verifications: list) -> SimpleNamespace:
        levels = [LevelRecord("mid", "verify", len(verifications), 5.0 * len(verifications), verifications),
                  LevelRecord("ngram", "draft", len(verifications), 0.1)]
        return SimpleNamespace(drafter="ngram→mid", draft_ids=[1] * k, accepted=acc, emitted_ids=[1] * (acc + 1), spans={"verifying": 50.0},
                               total_ms=60.0, levels=levels)

    return run_theory([step(3, 1, [[2, 3]]), step(4, 4, [[2, 3], [1, 1]]), step(2, 0, [[1, 2]])])


def test_explore_frames_pickle_for_zerogpu():
    from specviz.ui.explore import frame, step_table

    d = charts.dynamics_from_events(events(), METRICS)
    value = frame(status="<b>x</b>", race=charts.race_figure([charts.Series("a", [0, 1], [0, 2])]), dynamics=charts.dynamics_figure(d),
                  table=step_table([[1, "ngram", 4, "1 / 4", "✓✗··", 2, " hi", 0.0, 0.1, 40.0, 0.5, 0.5, 41.1, 0.2, ""]]),
                  session=new_session())
    restored = pickle.loads(pickle.dumps(value))
    assert restored[0] == "<b>x</b>" and restored[1] == {"__type__": "update"} and len(restored) == 13  # panel, files, export
