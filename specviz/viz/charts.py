"""Plotly figures: the race against autoregressive decoding, per-step dynamics, and the speedup formula.

Builders assemble plain dict specs (cheap to build while streaming) and wrap them in a Figure without
plotly's per-property validation; the tests validate every spec once with plotly itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go

from specviz.analysis.cost_model import StepShape, by_gamma, t1_of
from specviz.core.formulas import best_gamma, expected_tokens, speedup

PALETTE = ["#4C6FE0", "#E0784C", "#2E9D6B", "#B04CE0", "#C9A227"]
AR_COLOUR = "#6B7280"
PEER_COLOUR = "#111827"
SPLIT_COLOURS = {"prefill": "#9CA3AF", "deciding": "#8B5CF6", "drafting": "#E0784C", "verifying": "#4C6FE0",
                 "committing": "#C9A227", "recording": "#14B8A6", "outside": "#D1D5DB"}
DASHES = ["solid", "dot", "dashdot", "longdash", "longdashdot"]
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x"]
BASE_LAYOUT = {"template": "plotly_white", "margin": {"l": 55, "r": 20, "t": 50, "b": 45}, "font": {"size": 12},
               "legend": {"orientation": "h", "y": -0.2}}


@dataclass
class Series:
    """One run on the race chart: seconds since start and tokens generated so far."""

    label: str
    times: list[float]
    tokens: list[int]
    baseline: bool = False
    note: str = ""
    peer: bool = False
    """A reference known only by its total (transformers' generate): a straight dotted line at its mean rate."""


def figure(spec: Mapping) -> go.Figure:
    """A Figure from a dict spec, skipping validation (specs are validated in the tests)."""
    return go.Figure(dict(spec), _validate=False)


def race_spec(series: Sequence[Series], title: str = "Tokens generated vs wall-clock time") -> dict:
    data, k = [], 0
    for s in series:
        if s.peer:
            style = {"line": {"color": PEER_COLOUR, "dash": "dot", "width": 2}, "marker": {"symbol": "diamond-open", "size": 8}}
        elif s.baseline:
            style = {"line": {"color": AR_COLOUR, "dash": "dash", "width": 2}, "marker": {"symbol": "x", "size": 5}}
        else:
            style = {"line": {"color": PALETTE[k % len(PALETTE)], "dash": DASHES[k % len(DASHES)], "width": 2.5},
                     "marker": {"symbol": SYMBOLS[k % len(SYMBOLS)], "size": 6}}
            k += 1
        name = s.label + (f" — {s.note}" if s.note else "")
        data.append({"type": "scatter", "mode": "lines+markers", "x": s.times, "y": s.tokens, "name": name,
                     "line_shape": "linear" if s.peer else "hv",
                     "hovertemplate": "%{x:.2f} s: %{y} tokens<extra>" + s.label + "</extra>", **style})
    layout = {**BASE_LAYOUT, "title": {"text": title}, "height": 340,
              "legend": {"x": 0.01, "y": 0.99, "xanchor": "left", "yanchor": "top", "bgcolor": "rgba(255,255,255,0.75)"},
              "xaxis": {"title": {"text": "seconds since Run (incl. prefill)"}, "rangemode": "tozero"},
              "yaxis": {"title": {"text": "tokens generated"}, "rangemode": "tozero"}}
    return {"data": data, "layout": layout}


def race_figure(series: Sequence[Series], title: str = "Tokens generated vs wall-clock time") -> go.Figure:
    return figure(race_spec(series, title))


_COLUMNS, _ROWS = ([0, 0.44], [0.56, 1]), ([0.74, 1], [0.39, 0.63], [0, 0.24])


def _grid_layout(titles: Sequence[str], x_titles: Sequence[str], y_titles: Sequence[str]) -> dict:
    """A grid of independent axes, two cells a row, with a title above each cell."""
    layout: dict = {"annotations": []}
    for i in range(len(titles)):
        n = "" if i == 0 else str(i + 1)
        xd, yd = _COLUMNS[i % 2], _ROWS[i // 2]
        layout[f"xaxis{n}"] = {"domain": xd, "anchor": f"y{n}", "title": {"text": x_titles[i]}}
        layout[f"yaxis{n}"] = {"domain": yd, "anchor": f"x{n}", "title": {"text": y_titles[i]}, "rangemode": "tozero"}
        layout["annotations"].append({"text": f"<b>{titles[i]}</b>", "x": sum(xd) / 2, "y": yd[1] + 0.035, "xref": "paper",
                                      "yref": "paper", "showarrow": False, "xanchor": "center", "yanchor": "bottom"})
    return layout


@dataclass
class Dynamics:
    """What the per-step panel needs from one run (and, when measured, its AR baseline)."""

    steps: list[int]
    tokens_per_s: list[float]
    cumulative_tps: list[float]
    gammas: list[int]
    drafted: list[int]
    accepted: list[int]
    per_position: list[float]
    split_ms: dict[str, float]
    lengths: dict[int, list[int]] = field(default_factory=dict)
    """Per draft length (a tree: the depth it reached), how many of its steps kept 0, 1, … drafts."""
    by_gamma: list[dict] = field(default_factory=list)
    """The cost model at the run's acceptance, per γ (:func:`specviz.analysis.cost_model.by_gamma`)."""
    ar_tokens_per_s: float | None = None
    ar_split_ms: dict[str, float] | None = None
    extra: dict = field(default_factory=dict)


def dynamics_from_events(events: Sequence[Mapping], metrics: Mapping, ar_metrics: Mapping | None = None) -> Dynamics:
    steps = [e["step"] for e in events]
    tps = [1e3 * len(e["emitted_ids"]) / e["total_ms"] if e["total_ms"] > 0 else 0.0 for e in events]
    total, cum = 0, []
    for e in events:
        total += len(e["emitted_ids"])
        cum.append(1e3 * total / e["elapsed_ms"] if e["elapsed_ms"] > 0 else 0.0)
    lengths: dict[int, list[int]] = {}
    for shape in (StepShape.of(e) for e in events):
        if shape.depth:
            lengths.setdefault(shape.depth, [0] * (shape.depth + 1))[min(shape.accepted, shape.depth)] += 1
    return Dynamics(steps, tps, cum, [e["gamma"] for e in events], [len(e["draft_ids"]) for e in events], [e["accepted"] for e in events],
                    list(metrics.get("per_position_accept", [])), split_of(metrics), dict(sorted(lengths.items())),
                    by_gamma(events, t1_of(ar_metrics)), ar_metrics["tokens_per_s"] if ar_metrics else None,
                    split_of(ar_metrics) if ar_metrics else None)


def split_of(metrics: Mapping) -> dict[str, float]:
    """Where the wall time went, in ms: the prefill, each span of the steps, and the time between steps (the caller's)."""
    return {"prefill": max(0.0, metrics["prefill_ms"]), **metrics["spans_ms"], "outside": max(0.0, metrics["outside_ms"])}


def dynamics_spec(d: Dynamics) -> dict:
    data = [
        {"type": "bar", "x": d.steps, "y": d.tokens_per_s, "name": "tok/s this step", "marker": {"color": "#A5B4FC"},
         "xaxis": "x", "yaxis": "y", "legendgroup": "tps"},
        {"type": "scatter", "mode": "lines", "x": d.steps, "y": d.cumulative_tps, "name": "tok/s so far (incl. prefill)",
         "line": {"color": PALETTE[0], "width": 2.5}, "xaxis": "x", "yaxis": "y", "legendgroup": "tps"},
        {"type": "bar", "x": d.steps, "y": d.accepted, "name": "accepted drafts", "marker": {"color": "#2E9D6B"},
         "xaxis": "x2", "yaxis": "y2"},
        {"type": "bar", "x": d.steps, "y": [n - a for n, a in zip(d.drafted, d.accepted)], "name": "drafted, not accepted",
         "marker": {"color": "#F3B4B4", "pattern": {"shape": "/"}}, "xaxis": "x2", "yaxis": "y2"},
        {"type": "scatter", "mode": "lines+markers", "x": d.steps, "y": d.gammas, "name": "γ budget", "line": {"color": "#111827",
         "width": 1.5, "shape": "hv"}, "marker": {"symbol": "line-ew-open", "size": 8}, "xaxis": "x2", "yaxis": "y2"},
        {"type": "bar", "x": list(range(1, len(d.per_position) + 1)), "y": d.per_position, "name": "P(accept | drafted)",
         "marker": {"color": "#2E9D6B"}, "xaxis": "x3", "yaxis": "y3", "showlegend": False},
    ]
    if d.ar_tokens_per_s:
        data.append({"type": "scatter", "mode": "lines", "x": [d.steps[0] if d.steps else 0, d.steps[-1] if d.steps else 1],
                     "y": [d.ar_tokens_per_s] * 2, "name": "AR baseline tok/s", "line": {"color": AR_COLOUR, "dash": "dash"},
                     "xaxis": "x", "yaxis": "y"})
    for k, (length, counts) in enumerate(d.lengths.items()):
        data.append({"type": "bar", "x": list(range(length + 1)), "y": counts, "name": f"drafted {length}",
                     "marker": {"color": PALETTE[k % len(PALETTE)]}, "xaxis": "x5", "yaxis": "y5", "legendgroup": "lengths"})
    gammas = [row["gamma"] for row in d.by_gamma]
    data.append({"type": "scatter", "mode": "lines+markers", "x": gammas, "y": [row["tokens_per_step"] for row in d.by_gamma],
                 "name": "tokens per step at γ", "line": {"color": "#2E9D6B"}, "xaxis": "x6", "yaxis": "y6"})
    if any(row["speedup"] is not None for row in d.by_gamma):
        data.append({"type": "scatter", "mode": "lines+markers", "x": gammas, "y": [row["speedup"] for row in d.by_gamma],
                     "name": "predicted speedup at γ", "line": {"color": PALETTE[0], "dash": "dash"}, "xaxis": "x6", "yaxis": "y6"})
    runs = [("this run", d.split_ms)] + ([("AR", d.ar_split_ms)] if d.ar_split_ms else [])
    for part, colour in SPLIT_COLOURS.items():
        data.append({"type": "bar", "orientation": "h", "y": [r for r, _ in runs], "x": [s[part] / 1e3 for _, s in runs],
                     "name": part, "marker": {"color": colour, "pattern": {"shape": _PATTERNS[part]}},
                     "xaxis": "x4", "yaxis": "y4", "legendgroup": "split"})
    layout = {**BASE_LAYOUT, "height": 860, "barmode": "stack", "margin": {"l": 60, "r": 20, "t": 40, "b": 120},
              **_grid_layout(["Throughput per step", "γ budget and tokens drafted / accepted per step", "Acceptance by draft position",
                              "Where the time went", "Drafts kept per step, by draft length",
                              "At this acceptance, each γ would give"],
                             ["step", "step", "draft position", "seconds", "drafts kept", "γ"],
                             ["tokens / s", "drafted tokens", "acceptance rate", "", "steps", "× an AR step"])}
    layout["yaxis3"]["range"] = [0, 1.05]
    layout["legend"] = {"orientation": "h", "y": -0.14, "yanchor": "top"}
    return {"data": data, "layout": layout}


_PATTERNS = {"prefill": ".", "deciding": "\\", "drafting": "/", "verifying": "", "committing": "x", "recording": "+", "outside": "-"}


def dynamics_figure(d: Dynamics) -> go.Figure:
    return figure(dynamics_spec(d))


@dataclass
class Measured:
    """A finished run's numbers placed on the theory plot: α, c (draft time per token / T(1)), the mean γ (a tree: its
    node budget), tokens per step, the measured speedup and the cost model's predicted one."""

    alpha: float
    c: float
    gamma: float
    tokens_per_step: float
    speedup: float | None
    predicted: float | None = None
    tree: bool = False
    label: str = "last Explore run"


Cost = Callable[[int], float]


def free_verify(k: int) -> float:
    return 1.0


def theory_spec(alpha: float, c: float, gamma_max: int, measured: Measured | None = None, verify: Cost = free_verify) -> dict:
    """Expected tokens per step and the speedup S(γ) with the verify's cost ``verify(k)`` = T(k)/T(1) for k fed rows,
    beside the classic curve that takes verifying as free; the last run's measured and predicted points."""
    gs = list(range(gamma_max + 1))
    s = [speedup(alpha, c, g, verify(g + 1)) for g in gs]
    data = [
        {"type": "scatter", "mode": "lines+markers", "x": gs, "y": [expected_tokens(alpha, g) for g in gs],
         "name": f"E[tokens/step], α={alpha:.2f}", "line": {"color": PALETTE[0]}, "xaxis": "x", "yaxis": "y"},
        {"type": "scatter", "mode": "lines+markers", "x": gs, "y": s, "name": f"S(γ), α={alpha:.2f}, c={c:.3f}, measured T(k)/T(1)",
         "line": {"color": PALETTE[1]}, "xaxis": "x2", "yaxis": "y2"},
        {"type": "scatter", "mode": "lines", "x": gs, "y": [speedup(alpha, c, g) for g in gs], "name": "S(γ) if verifying were free",
         "line": {"color": PALETTE[1], "dash": "dot", "width": 1}, "opacity": 0.6, "xaxis": "x2", "yaxis": "y2"},
        {"type": "scatter", "mode": "lines", "x": [0, gamma_max], "y": [1, 1], "name": "S = 1 (break-even)",
         "line": {"color": AR_COLOUR, "dash": "dash"}, "xaxis": "x2", "yaxis": "y2"},
    ]
    g_star = best_gamma(alpha, c, gamma_max, verify)
    data.append({"type": "scatter", "mode": "markers", "x": [g_star], "y": [s[g_star]], "name": f"best γ* = {g_star}",
                 "marker": {"symbol": "star", "size": 14, "color": PALETTE[1]}, "xaxis": "x2", "yaxis": "y2"})
    if measured is not None:
        data += _measured_traces(measured, gs, verify)
    layout = {**BASE_LAYOUT, "height": 460, "title": {"text": "Speculative decoding: theory with the verify's measured cost"},
              "margin": {"l": 55, "r": 20, "t": 50, "b": 130}, "legend": {"orientation": "h", "y": -0.2, "yanchor": "top"},
              "xaxis": {"domain": [0, 0.45], "title": {"text": "γ (drafted tokens or tree nodes per step)"}},
              "yaxis": {"title": {"text": "expected tokens per target forward"}, "rangemode": "tozero"},
              "xaxis2": {"domain": [0.55, 1], "anchor": "y2", "title": {"text": "γ"}},
              "yaxis2": {"anchor": "x2", "title": {"text": "speedup over AR"}, "rangemode": "tozero"}}
    return {"data": data, "layout": layout}


def _measured_traces(m: Measured, gs: list[int], verify: Cost) -> list[dict]:
    mark = {"symbol": "diamond", "size": 13, "color": PALETTE[2], "line": {"width": 1.5, "color": "#111"}}
    what = "tree" if m.tree else "run"
    traces = [
        {"type": "scatter", "mode": "markers", "x": [m.gamma], "y": [m.tokens_per_step], "name": f"measured ({m.label})",
         "marker": mark, "xaxis": "x", "yaxis": "y"},
    ]
    if not m.tree:  # a chain's i.i.d. curves; a tree's tokens per step follow its per-depth acceptance, not α
        traces += [
            {"type": "scatter", "mode": "lines", "x": gs, "y": [expected_tokens(m.alpha, g) for g in gs],
             "name": f"predicted from measured α={m.alpha:.2f}", "line": {"color": PALETTE[2], "dash": "dot"}, "xaxis": "x", "yaxis": "y"},
            {"type": "scatter", "mode": "lines", "x": gs, "y": [speedup(m.alpha, m.c, g, verify(g + 1)) for g in gs],
             "name": f"predicted from measured α, c={m.c:.3f}", "line": {"color": PALETTE[2], "dash": "dot"}, "xaxis": "x2", "yaxis": "y2"},
        ]
    if m.predicted is not None:
        traces.append({"type": "scatter", "mode": "markers", "x": [m.gamma], "y": [m.predicted],
                       "name": f"cost model's prediction ({what})",
                       "marker": {"symbol": "x-thin", "size": 16, "color": PALETTE[3], "line": {"width": 3, "color": PALETTE[3]}},
                       "xaxis": "x2", "yaxis": "y2"})
    if m.speedup is not None:
        traces.append({"type": "scatter", "mode": "markers", "x": [m.gamma], "y": [m.speedup], "name": f"measured speedup ({m.label})",
                       "marker": mark, "xaxis": "x2", "yaxis": "y2"})
    return traces


def theory_figure(alpha: float, c: float, gamma_max: int, measured: Measured | None = None, verify: Cost = free_verify) -> go.Figure:
    return figure(theory_spec(alpha, c, gamma_max, measured, verify))


def empty_figure(message: str, height: int = 300) -> go.Figure:
    return figure({"data": [], "layout": {**BASE_LAYOUT, "height": height, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                          "annotations": [{"text": message, "showarrow": False, "font": {"size": 14}}]}})


def length_distribution_spec(theory: Mapping) -> dict:
    """Theorem 3.3 per verifying level: the predicted capped-geometric distribution of acceptance lengths
    (bars, outlined) against the measured one (bars, filled)."""
    data = []
    for k, (name, rep) in enumerate(theory.get("acceptance", {}).items()):
        if rep.get("a") is None:
            continue
        lengths = list(range(1, len(rep["pmf_measured"]) + 1))
        colour = PALETTE[k % len(PALETTE)]
        data += [{"type": "bar", "x": lengths, "y": rep["pmf_measured"], "name": f"{name}: measured", "marker": {"color": colour}},
                 {"type": "bar", "x": lengths, "y": rep["pmf_predicted"], "name": f"{name}: predicted (a={rep['a']:.2f})",
                  "marker": {"color": "rgba(0,0,0,0)", "line": {"color": colour, "width": 2},
                             "pattern": {"shape": "/", "fgcolor": colour}}}]
    layout = {**BASE_LAYOUT, "height": 340, "barmode": "group", "title": {"text": "Theorem 3.3: acceptance length per verification"},
              "xaxis": {"title": {"text": "tokens passed up per verification (L)"}, "dtick": 1},
              "yaxis": {"title": {"text": "share of verifications"}, "rangemode": "tozero"}}
    return {"data": data, "layout": layout}


def length_distribution_figure(theory: Mapping) -> go.Figure:
    return figure(length_distribution_spec(theory))
