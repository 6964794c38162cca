"""Explain tab: the speedup formula, with the verify's measured cost, as an interactive plot, and the last Explore run's
prediction (from its per-depth acceptance, draft cost and verify cost) against what it measured."""

from __future__ import annotations

import html

import gradio as gr

from specviz.analysis.cost_model import VerifyCost, predict_run, t1_of
from specviz.ui.state import ensure_session
from specviz.viz import charts
from specviz.viz.render import status_html

FORMULA = r"""
A step drafts γ tokens (or a token tree of γ nodes), then the target verifies the k = γ + 1 fed rows in one forward. With
per-token acceptance **α** (i.i.d.), **c** = draft time per token ÷ T(1), the time of a one-token target step, and
**r(k)** = T(k) / T(1), the verify's cost over k rows measured on the machine:

$$E = \frac{1-\alpha^{\gamma+1}}{1-\alpha} \text{ tokens per step} \qquad S(\gamma) = \frac{E}{\gamma c + r(\gamma+1)}$$

With r = 1 (verifying treated as free) this is the classic formula, where some γ gives a speedup exactly when α > c; the
measured r(k) moves the best γ down wherever a wider verify costs more. For your last Explore run the model reads
everything from the run: tokens per step from its per-depth acceptance a_d (a step drafting D deep emits
1 + Σ_{d≤D} Π_{j≤d} a_j: a tree's accepted path, a chain's accepted prefix), c from its draft time, and r(k) from its
verify time against its AR baseline's T(1) (without a baseline, from the committed profile). It leaves out prefill and
the engine's own overhead, so measured points sit a little below their prediction.
"""


def verify_cost(prediction: dict | None) -> VerifyCost:
    """r(k) for the curves: the last run's own T(k)/T(1) (its :func:`run_prediction`) where it has an AR baseline
    (between and beyond the row counts it fed, as :class:`VerifyCost` extends them), else the committed profile."""
    profile = VerifyCost.load()
    if prediction and prediction["verify_source"] != profile.source:
        return VerifyCost({k: r for k, r in prediction["verify_ratio"].items() if k > 1}, prediction["verify_source"])
    return profile


def run_prediction(session: dict | None) -> dict | None:
    """The cost model's prediction for the last speculative Explore run (None without one)."""
    last = ensure_session(session).get("last")
    if not last or last["config"]["method"] != "sd" or not last.get("events"):
        return None
    return predict_run(last["events"], t1_of((last.get("ar") or {}).get("metrics")))


def measured_from(session: dict | None, prediction: dict | None) -> charts.Measured | None:
    """α, c, mean γ, tokens per step, speedup and the predicted speedup (``prediction``: its :func:`run_prediction`) of
    the last speculative Explore run (None if there is none)."""
    last = ensure_session(session).get("last")
    if prediction is None:
        return None
    m, tree = last["metrics"], bool(last["config"].get("tree_nodes"))
    return charts.Measured(prediction["alpha"], prediction["c"], prediction["mean_rows"] - 1, m["mean_accept_len"], last.get("speedup"),
                           prediction["predicted_speedup"], tree, f"run #{last.get('run', '?')}")


def summary_markdown(alpha: float, c: float, gamma_max: int, measured: charts.Measured | None,
                     verify: VerifyCost | None = None, prediction: dict | None = None) -> str:
    verify = verify or VerifyCost.load()
    g = charts.best_gamma(alpha, c, gamma_max, verify)
    verdict = "a speedup is possible" if g > 0 else "no γ gives a speedup at this cost"
    lines = [f"**Sliders:** α = {alpha:.2f}, c = {c:.3f} → {verdict}; best γ* = {g} with S = "
             f"{charts.speedup(alpha, c, g, verify(g + 1)):.2f}× and {charts.expected_tokens(alpha, g):.2f} tokens per step "
             f"(verifying free: γ* = {charts.best_gamma(alpha, c, gamma_max)}). r(k) = T(k)/T(1): "
             + ", ".join(f"{k}: {verify(k):.2f}" for k in (2, 3, 4, 5, 9)) + f" ({verify.source})."]
    if measured is None or prediction is None:
        lines.append("**Measured:** none yet: run a speculative decode in the Explore tab, then come back (or press the button).")
        return "\n\n".join(lines)
    rows = ", ".join(f"r({k}) = {r:.2f}" for k, r in prediction["verify_ratio"].items())
    shape = (f"token tree of {measured.gamma:.0f} nodes" if measured.tree else f"mean γ = {measured.gamma:.1f}")
    depth = " ".join(f"{a:.2f}" for a in prediction["per_depth_acceptance"])
    speed = (f"measured **{measured.speedup:.2f}×**, {100 * (measured.speedup / measured.predicted - 1):+.0f}% from the prediction"
             if measured.speedup is not None else "not measured (no AR baseline)")
    lines.append(f"**Measured ({measured.label}):** {shape}; per-depth acceptance {depth}; tokens per step "
                 f"{measured.tokens_per_step:.2f} (predicted {prediction['tokens_per_step']:.2f}); c = {measured.c:.3f}; "
                 f"{rows} ({prediction['verify_source']}). Speedup: predicted **{measured.predicted:.2f}×**, {speed}.")
    return "\n\n".join(lines)


def _table(header: list[str], rows: list[list]) -> str:
    cell = (lambda v: f"{v:.3g}" if isinstance(v, float) else html.escape(str(v)))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def theory_html(session: dict | None) -> str:
    """Lemma 3.1 / Theorems 3.2–3.3 for the last Explore run: per-level T_i and L_i, predicted against
    measured tokens/s, and the insertion test for every intermediate level of a chain."""
    last = ensure_session(session).get("last")
    theory = last.get("theory") if last else None
    if not theory:
        return status_html("Run something in the Explore tab (a polybasic chain shows every level): Lemma 3.1's predicted "
                           "time, Theorem 3.2's insertion test and Theorem 3.3's acceptance lengths appear here.", "info")
    levels = _table(["level", "role", "T_i (ms per forward)", "L_i (tokens per verification)", "forwards", "forwards predicted (N/L_i)"],
                    [[lv["name"], lv["role"], lv["T_ms"], lv.get("L", f"β = {lv.get('beta', 0):.2f} passes/verification"),
                      lv["passes"], lv.get("predicted_passes", "–")] for lv in theory["levels"]])
    pred, meas = theory["predicted_tokens_per_s"], theory["measured_tokens_per_s"]
    error = f"{100 * (pred / meas - 1):+.0f}%" if pred and meas else "–"
    parts = [f"<b>Run #{html.escape(str(last.get('run', '?')))}: {theory['tokens']} tokens.</b> Lemma 3.1 predicts "
             f"<b>{pred or 0:.1f} tok/s</b>; measured (decode only) <b>{meas or 0:.1f} tok/s</b> ({error}).", levels]
    acceptance = [[name, rep["a"], rep["mean_cap"], rep["mean_predicted"], rep["mean_measured"], rep["second_moment_predicted"],
                   rep["second_moment_measured"]] for name, rep in theory["acceptance"].items() if rep.get("a") is not None]
    if acceptance:
        parts += ["<b>Theorem 3.3</b> (per-token acceptance a, cap m = K + 1 per verification)",
                  _table(["verifier", "a", "mean m", "E[L] predicted", "E[L] measured", "E[L²] predicted", "E[L²] measured"], acceptance)]
    if theory["insertions"]:
        parts += ["<b>Theorem 3.2</b>: inserting M_new below M_i helps iff T_new/T_i < L_new·(1/L_i − 1/L_i′). L_i (without "
                  "M_new) needs a run without it: the level helps if that run's L_i is below the break-even.",
                  _table(["inserted", "below", "T_new/T_i", "L_new", "L_i′ (with it)", "break-even L_i"],
                         [[i["inserted"], i["below"], i["T_new/T_i"], i["L_new"], i["L_i_after"], i["L_i_break_even"]]
                          for i in theory["insertions"]])]
    return '<div class="sv-theory">' + "".join(f"<div>{p}</div>" for p in parts) + "</div>"


def theory_figure_of(session: dict | None):
    last = ensure_session(session).get("last")
    theory = last.get("theory") if last else None
    if not theory or not any(r.get("a") is not None for r in theory["acceptance"].values()):
        return charts.empty_figure("acceptance lengths appear after a speculative run", 340)
    return charts.length_distribution_figure(theory)


def explain_update(alpha: float, c: float, gamma_max: float, session: dict | None) -> tuple:
    """Plot, numbers and the polybasic section for the slider values (and the last run, when there is one)."""
    try:
        prediction = run_prediction(session)
        measured, verify = measured_from(session, prediction), verify_cost(prediction)
        gmax = max(1, int(gamma_max or 1))
        a, cost = min(max(float(alpha), 0.0), 0.999), max(float(c), 0.0)
        return (charts.theory_figure(a, cost, gmax, measured, verify),
                summary_markdown(a, cost, gmax, measured, verify, prediction), theory_html(session),
                theory_figure_of(session))
    except Exception as exc:  # a plot must never take the page down
        return gr.skip(), f"⚠ could not draw the plot: {exc}", gr.skip(), gr.skip()


def use_measured(session: dict | None) -> tuple:
    """Move the sliders to the last run's α and c."""
    m = measured_from(session, run_prediction(session))
    if m is None:
        gr.Info("No speculative Explore run yet: run one first.")
        return gr.skip(), gr.skip()
    return round(min(m.alpha, 0.99), 2), round(min(m.c, 1.0), 3)


def build_explain_tab(session: gr.State) -> tuple:
    """The Explain tab (inside a gr.Tab context); returns the components the tab-select refresh needs."""
    gr.Markdown(FORMULA, latex_delimiters=[{"left": "$$", "right": "$$", "display": True}])
    with gr.Row():
        alpha = gr.Slider(0, 0.99, value=0.7, step=0.01, label="α: per-token acceptance", elem_id="explain-alpha")
        c = gr.Slider(0, 1, value=0.05, step=0.005, label="c: draft cost / target cost", elem_id="explain-c")
        gamma_max = gr.Slider(1, 32, value=12, step=1, label="γ max", elem_id="explain-gmax")
    use = gr.Button("Use the measured α and c of my last Explore run")
    plot = gr.Plot(charts.theory_figure(0.7, 0.05, 12, verify=VerifyCost.load()), label="Expected tokens per step and speedup vs γ",
                   elem_id="explain-plot")
    numbers = gr.Markdown(summary_markdown(0.7, 0.05, 12, None), elem_id="explain-numbers")
    gr.Markdown("### Polybasic theory: predicted vs measured")
    theory = gr.HTML(theory_html(None), elem_id="explain-theory")
    lengths = gr.Plot(theory_figure_of(None), label="Acceptance lengths: Theorem 3.3 vs measured", elem_id="explain-lengths")
    inputs, outputs = [alpha, c, gamma_max, session], [plot, numbers, theory, lengths]
    gr.on([alpha.release, c.release, gamma_max.release], explain_update, inputs, outputs, api_name="explain")
    use.click(use_measured, session, [alpha, c], api_visibility="private").then(explain_update, inputs, outputs, api_visibility="private")
    return inputs, outputs
