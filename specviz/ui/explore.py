"""Explore tab: one live run, streamed step by step and raced against the autoregressive baseline.

The speculative run streams first (first tokens within a second of Run once models are loaded); the AR
baseline for the same prompt and settings is then measured right after it (or before it, or reused from
this session's cache) and added to the charts, and the headline says which.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gradio as gr
import pandas as pd

from specviz.analysis.result import result_of
from specviz.api import Trace, read_trace, token_pieces, trace_of
from specviz.core.engine import StepEvent
from specviz.core.errors import ConfigError
from specviz.core.metrics import summarize
from specviz.models.paths import ASSETS
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import RunPlan, plan
from specviz.ui.bank import LOADING_MESSAGE, Models, shared_models
from specviz.ui.controls import (
    BASELINE_AFTER,
    BASELINE_BEFORE,
    BASELINE_SKIP,
    DecodeControls,
    decode_concurrency,
    decode_controls,
    default_prompt,
    example_prompts,
    guarded,
    wire_decode_controls,
)
from specviz.ui.decode import decode_steps
from specviz.ui.exports import export_folder
from specviz.ui.state import baseline_key, ensure_session, get_baseline, make_config, put_baseline, run_record
from specviz.ui.teach import build_step_panel, live_panel, view_update, wire_step_panel
from specviz.viz import charts
from specviz.viz.export import SPEEDS, race_series, trace_headline, trace_page
from specviz.viz.export import run_label as trace_label
from specviz.viz.render import REASON_LEGEND, Headline, TokenSpan, headline_html, legend_html, spans_html, status_html
from specviz.viz.trace import STEP_COLUMNS, TraceBuilder, cumulative, step_row

VIEW, TOKENS_ID = "explore", "explore-tokens"
"""The step panel's view key in the session, and the token view it marks."""
GALLERY = ASSETS / "traces"
CHARTS_EVERY_S = 1.5
AR_LABEL = "autoregressive (AR baseline)"
PLACEHOLDER = ('<span class="sv-placeholder">Generated tokens stream here, one marked span per token: hover a token for its step, '
               'p (target), q (draft) and judge score.</span>')


def frame(status=None, headline=None, tokens=None, race=None, dynamics=None, table=None, session=None, panel=None, files=None) -> tuple:
    """One update of the Explore outputs; ``None`` leaves an output as it is. ``panel``: the step panel's (step,
    narration, microscope); ``files``: the saved trace and HTML page."""
    values = (status, headline, tokens, race, dynamics, table, session, *(panel or (None,) * 3), *(files or (None,) * 2))
    return tuple(gr.skip() if v is None else v for v in values)


def step_table(rows: list[list] | None = None) -> pd.DataFrame:
    return pd.DataFrame(rows or [], columns=STEP_COLUMNS)


def run_label(config: DecodeConfig) -> str:
    if config.method == "ar":
        return "autoregressive (this run)"
    extra = "" if config.gamma_policy == "fixed" else f", {config.gamma_policy}"
    rule = "" if config.accept == "exact" else f", {config.accept}"
    drafts = "select " + "/".join(config.select) if config.select else (config.draft or "default draft")
    return f"speculative ({drafts}, γ={config.gamma}{extra}{rule})"


def ar_config(config: DecodeConfig) -> DecodeConfig:
    return replace(config, method="ar", draft=None, chain=[], select=[], gamma_policy="fixed", accept="exact")


class Live:
    """What the charts and headline of a streaming run need, updated batch by batch."""

    def __init__(self, plan: RunPlan, label: str):
        self.plan, self.label = plan, label
        self.builder = TraceBuilder(plan.tokenizer, plan.prompt_ids)
        self.events: list[StepEvent] = []
        self.tokens_html = ""
        self.view = {"steps": self.builder.events, "pieces": {}, "config": plan.config.to_dict(), "baseline": None, "follow": True}

    def add(self, batch: list[dict]) -> None:
        events = [StepEvent(**step) for step in batch]
        self.events += events
        self.tokens_html += spans_html(self.builder.add_all(events))
        self.view["pieces"].update(token_pieces(self.plan.tokenizer, events))

    def stream(self, prompt: str) -> Iterator[list[dict]]:
        """The run's steps from the decode (the GPU worker on ZeroGPU), batch by batch, recorded here as they come."""
        for batch in decode_steps(self.plan.config.to_dict(), prompt):
            self.add(batch)
            yield batch

    def metrics(self) -> dict:
        return summarize(self.events)

    def series(self, baseline: bool = False, note: str = "") -> charts.Series:
        times, tokens = cumulative(self.builder.events)
        return charts.Series(self.label, times, tokens, baseline=baseline, note=note)


def _ar_series(ar: dict | None, note: str = "") -> list[charts.Series]:
    if not ar:
        return []
    times, tokens = cumulative(ar["events"])
    return [charts.Series(AR_LABEL, times, tokens, baseline=True, note=note)]


def _headline(metrics: dict, config: DecodeConfig, ar: dict | None, note: str) -> str:
    if config.method == "ar":
        return headline_html(Headline(1.0, metrics["tokens_per_s"], metrics["tokens_per_s"], 1.0, None, metrics["new_tokens"],
                                      metrics["wall_s"], "this run is the autoregressive baseline"))
    ar_tps = ar["metrics"]["tokens_per_s"] if ar else None
    speed = metrics["tokens_per_s"] / ar_tps if ar_tps else None
    return headline_html(Headline(speed, metrics["tokens_per_s"], ar_tps, metrics["mean_accept_len"],
                                  metrics["accept_rate"] if metrics["drafted"] else None, metrics["new_tokens"], metrics["wall_s"], note))


def _charts(live: Live, ar: dict | None, ar_note: str) -> tuple:
    metrics = live.metrics()
    race = charts.race_figure([live.series()] + _ar_series(ar, ar_note))
    dyn = charts.dynamics_figure(charts.dynamics_from_events(live.builder.events, metrics, ar["metrics"] if ar else None))
    return race, dyn


def _measure_ar(models: Models, config: DecodeConfig, prompt: str, session: dict, when: str,
                shown: list[charts.Series]) -> Iterator[tuple]:
    """Stream the AR baseline (chart and status only); stores it in the session cache and returns it."""
    cfg = ar_config(config)
    ar_plan = plan(cfg, prompt, models.bank)
    live, last = Live(ar_plan, AR_LABEL), 0.0
    for _ in live.stream(prompt):
        if time.perf_counter() - last >= CHARTS_EVERY_S:
            last = time.perf_counter()
            race = charts.race_figure(shown + [live.series(baseline=True, note=f"measuring {when}…")])
            yield frame(status=status_html(f"Measuring the AR baseline {when} (same prompt and settings): "
                                           f"{live.builder.new_tokens}/{cfg.max_new_tokens} tokens…", "busy"), race=race)
    record = run_record(AR_LABEL, cfg, live.builder.events, result_of(ar_plan, live.events), measured=when,
                        run=session["runs"], trace=trace_of(prompt, ar_plan, live.events).to_dict())
    put_baseline(session, baseline_key(config, prompt), record)
    return record


def _baseline_note(ar: dict | None, mode: str, method: str) -> str:
    if method == "ar":
        return "this run is the AR baseline"
    if ar is None:
        return "AR baseline skipped" if mode == BASELINE_SKIP else "measuring the AR baseline next"
    if ar.get("reused"):
        return f"AR measured at {ar['finished_at']} ({ar['measured']}), reused: same prompt and settings"
    return f"AR measured {ar['measured']}, same prompt and settings"


def explore_frames(models: Models, prompt: str, config: DecodeConfig, baseline: str, session: dict) -> Iterator[tuple]:
    """The Explore handler's body: load, (AR before), stream the run, (AR after), final numbers."""
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty: type a prompt or pick an example")
    session["runs"] += 1
    live_info = session["live"] = {"running": True, "tokens": 0, "run": session["runs"]}
    run = plan(config, prompt, models.bank)
    if not models.is_loaded(config):
        yield frame(status=status_html(LOADING_MESSAGE, "busy"))
    models.load_weights(config)
    key = baseline_key(config, prompt)
    cached = get_baseline(session, key) if config.method == "sd" else None
    ar = {**cached, "reused": True} if cached else None
    cleared = dict(tokens="", table=step_table(), race=charts.empty_figure("waiting for the first step…"),
                   dynamics=charts.empty_figure("waiting for the first step…", 600), headline="", session=session)
    if ar is None and config.method == "sd" and baseline == BASELINE_BEFORE:
        yield frame(status=status_html("Measuring the AR baseline first…", "busy"), **cleared)
        ar = yield from _measure_ar(models, config, prompt, session, "before the run", [])
        cleared.pop("race")
    live = Live(run, run_label(config))
    session["views"][VIEW] = live.view
    yield frame(status=status_html(f"Decoding: {live.label}: prefilling {len(run.prompt_ids)} prompt tokens…", "busy"),
                panel=view_update(None, None, TOKENS_ID), **cleared)
    yield from _stream_main(live, prompt, config, ar, _baseline_note(ar, baseline, config.method), live_info)
    result = result_of(run, live.events)
    record = run_record(live.label, config, live.builder.events, result, prompt=prompt, run=session["runs"])
    if config.method == "ar":
        put_baseline(session, key, {**record, "label": AR_LABEL, "measured": f"as Explore run #{session['runs']}"})
    elif ar is None and baseline == BASELINE_AFTER:
        ar = yield from _measure_ar(models, config, prompt, session, "after the run", [live.series()])
    session["last"] = {**record, "ar": ar and {"metrics": ar["metrics"], "token_ids": ar["token_ids"]}}
    trace = trace_of(prompt, run, live.events).to_dict()
    trace["baseline"] = ar.get("trace") if ar and config.method == "sd" else None
    session["views"][VIEW] = {**trace, "follow": True}
    live_info["running"] = False
    yield _final_frame(live, config, ar, baseline, session, result, trace)


def _stream_main(live: Live, prompt: str, config: DecodeConfig, ar: dict | None, note: str, live_info: dict) -> Iterator[tuple]:
    last_chart = 0.0
    for _ in live.stream(prompt):
        live_info["tokens"] = live.builder.new_tokens
        race = dyn = table = None
        if time.perf_counter() - last_chart >= CHARTS_EVERY_S:  # charts and the table are the costly outputs: throttled
            race, dyn = _charts(live, ar, note)
            table = step_table(live.builder.rows)
            last_chart = time.perf_counter()
        done = f"{live.builder.new_tokens}/{config.max_new_tokens}"
        status = status_html(f"Decoding: {live.label}: step {len(live.events)}, {done} tokens…", "busy")
        yield frame(status=status, headline=_headline(live.metrics(), config, ar, note + " (so far)"), tokens=live.tokens_html,
                    race=race, dynamics=dyn, table=table, panel=live_panel(live.view, TOKENS_ID))


def _final_frame(live: Live, config: DecodeConfig, ar: dict | None, baseline: str, session: dict, result: dict, trace: dict) -> tuple:
    note = _baseline_note(ar, baseline, config.method)
    metrics = result["metrics"]
    if ar is not None and config.method == "sd":
        session["last"]["speedup"] = metrics["tokens_per_s"] / ar["metrics"]["tokens_per_s"]
    same = ""
    if ar is not None and config.method == "sd" and config.temperature == 0 and config.accept == "exact":
        same = f" Output identical to the AR baseline: {'yes' if ar['token_ids'] == result['token_ids'] else 'no'}."
    elif ar is not None and config.method == "sd" and config.accept == "exact":
        same = " Sampling: exact speculative decoding matches AR in distribution, not token for token."
    stop = "stopped at end-of-sequence" if metrics["new_tokens"] < config.max_new_tokens else "reached max new tokens"
    message = (f"Done (run #{session['runs']}): {metrics['new_tokens']} tokens in {metrics['wall_s']:.2f} s, {stop}. "
               f"{note[0].upper() + note[1:]}.{same}")
    race, dyn = _charts(live, ar, note)
    return frame(status=status_html(message, "ok"), headline=_headline(metrics, config, ar, note), tokens=live.tokens_html,
                 race=race, dynamics=dyn, table=step_table(live.builder.rows), session=session,
                 panel=view_update(trace, None, TOKENS_ID), files=save_trace_files(trace))


def save_trace_files(trace: dict) -> tuple[str, str]:
    """The run as a trace file and as a self-contained HTML page, for the browser to download."""
    folder = export_folder()
    name = re.sub(r"[^a-z0-9]+", "-", trace_label(trace["config"]).lower()).strip("-")[:60] or "run"
    json_path, html_path = folder / f"specviz-{name}.json", folder / f"specviz-{name}.html"
    Trace.from_dict(trace).save(json_path)
    html_path.write_text(trace_page(trace))
    return str(json_path), str(html_path)


def gallery() -> dict[str, Path]:
    """The bundled example traces by label (a visitor sees a complete run before any model has loaded)."""
    return {path.stem.replace("-", " "): path for path in sorted(GALLERY.glob("*.json"))}


def trace_frames(path: str | Path | None, name: str, session: dict) -> tuple:
    """Show a trace file in every Explore view (no model needed): tokens, headline, charts, steps, step panel; the
    Explain tab reads it too."""
    if not path:
        raise ConfigError("choose a trace file (.json) first")
    trace = Trace.from_dict(read_trace(path))
    data = trace.to_dict()
    session["views"][VIEW] = {**data, "follow": True}
    session["last"] = {"label": f"trace {name}", "config": data["config"], "events": data["steps"], "metrics": data["metrics"],
                       "text": data["text"], "token_ids": data["token_ids"], "theory": data["theory"], "run": f"trace {name}",
                       "finished_at": "", "speedup": trace.speedup}
    base = data["baseline"]
    dyn = charts.dynamics_figure(charts.dynamics_from_events(data["steps"], data["metrics"], base["metrics"] if base else None))
    rows = [step_row(e, [s for s in trace.spans if s.step == e["step"]]) for e in data["steps"]]
    models = trace.models
    status = (f"Loaded trace '{name}': {trace_label(data['config'])}; target {models.get('target', '?')}, recorded on "
              f"{trace.machine or 'an unknown machine'}. Every view works without a model: step through it, replay it.")
    return frame(status=status_html(status, "ok"), headline=headline_html(trace_headline(data)), tokens=spans_html(trace.spans),
                 race=charts.race_figure(race_series(data)), dynamics=dyn, table=step_table(rows), session=session,
                 panel=view_update(data, None, TOKENS_ID))


def open_trace(upload: str | None, session: dict | None) -> Iterator[tuple]:
    """Load an uploaded trace file; a bad file is a visible one-line error and the app keeps serving."""
    session = ensure_session(session)
    yield from guarded(lambda: iter([trace_frames(upload, Path(upload or "").name, session)]),
                       lambda message: frame(status=status_html(message, "error")))


def open_example(label: str | None, session: dict | None) -> Iterator[tuple]:
    session = ensure_session(session)
    examples = gallery()
    yield from guarded(lambda: iter([trace_frames(examples.get(label or ""), label or "", session)]),
                       lambda message: frame(status=status_html(message, "error")))


def replay_frames(speed: float, session: dict | None) -> Iterator[tuple]:
    """Replay the finished run (or the loaded trace) in the token view at ``speed``× real time, racing its AR baseline."""
    view = ensure_session(session)["views"].get(VIEW)
    if not view or "spans" not in view:
        raise ConfigError("nothing to replay yet: finish a run or load a trace first")
    speed = min(4.0, max(0.25, float(speed or 1)))
    spans = [TokenSpan(*s) for s in view["spans"]]
    series = race_series(view)
    start, last_chart = time.perf_counter(), 0.0
    for k, event in enumerate(view["steps"], start=1):
        time.sleep(max(0.0, event["elapsed_ms"] / 1e3 / speed - (time.perf_counter() - start)))
        t = event["elapsed_ms"] / 1e3
        race = None
        if k == len(view["steps"]):  # the end: the whole race, the baseline's finish included
            race = charts.race_figure(series)
        elif time.perf_counter() - last_chart >= 0.5:
            race, last_chart = charts.race_figure([until_time(s, t) for s in series]), time.perf_counter()
        yield (spans_html(s for s in spans if s.step <= k), race or gr.skip(), *view_update(view, k, TOKENS_ID))


def until_time(series: charts.Series, t: float) -> charts.Series:
    keep = sum(1 for x in series.times if x <= t)
    return replace(series, times=series.times[:keep], tokens=series.tokens[:keep])


def replay_run(speed: float, session: dict | None) -> Iterator[tuple]:
    yield from guarded(lambda: replay_frames(speed, session), lambda message: (gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()))


def explore_run(prompt: str, preset: str, method: str, draft: str, gamma: float, gamma_policy: str, accept: str,
                judge_threshold: float, lenience: float, topk: float, chain: list[str], select: list[str], temperature: float,
                top_p: float, seed: float, max_new_tokens: float, chat: bool, baseline: str, session: dict | None):
    """Stream one run: status, headline, token spans, race chart, per-step charts, step table."""
    session = ensure_session(session)

    def frames() -> Iterator[tuple]:
        config = make_config(preset=preset, method=method, draft=draft, gamma=gamma, gamma_policy=gamma_policy, accept=accept,
                             judge_threshold=judge_threshold, lenience=lenience, topk=topk, chain=chain, select=select,
                             temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, chat=chat)
        yield from explore_frames(shared_models(), prompt, config, baseline or BASELINE_AFTER, session)

    def on_error(message: str) -> tuple:
        session["live"]["running"] = False
        return frame(status=status_html(message, "error"), session=session)

    yield from guarded(frames, on_error)


def explore_stopped(session: dict | None) -> str:
    """Status after Stop: what was kept (the cancelled generator cannot say it itself)."""
    live = (session or {}).get("live") or {}
    if not live.get("running") or live.get("kind", "explore") != "explore":
        return gr.skip()
    return status_html(f"Stopped after {live.get('tokens', 0)} tokens (run #{live.get('run')}); the partial run is kept, "
                       "no AR baseline was measured for it.", "stopped")


def build_explore_tab(session: gr.State) -> DecodeControls:
    """The Explore tab's layout and events (inside a Blocks context)."""
    rows, labels = example_prompts()
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(default_prompt(), lines=4, label="Prompt", elem_id="explore-prompt")
            if rows:
                gr.Examples(rows, [prompt], label="Example prompts (from the benchmark suites)", example_labels=labels, examples_per_page=6)
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="explore-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="explore-stop")
            baseline = gr.Radio([BASELINE_AFTER, BASELINE_BEFORE, BASELINE_SKIP], value=BASELINE_AFTER,
                                label="AR baseline (same prompt and settings; reused from this session when already measured)",
                                elem_id="explore-baseline")
            status = gr.HTML(status_html("Pick a prompt and press Run.", "info"), label="Status", elem_id="explore-status")
        with gr.Column(scale=2):
            controls = decode_controls()
            hint = gr.HTML("", elem_id="explore-hint")
    headline = gr.HTML("", label="Headline numbers", elem_id="explore-headline")
    gr.HTML(legend_html(), elem_id="explore-legend")
    tokens = gr.HTML(PLACEHOLDER, label="Tokens", elem_id="explore-tokens", elem_classes=["sv-tokens", "sv-token-box"])
    race = gr.Plot(charts.empty_figure("Press Run: tokens vs time, against the AR baseline"), label="Race against autoregressive decoding",
                   elem_id="explore-race")
    dynamics = gr.Plot(charts.empty_figure("Press Run: throughput, γ, acceptance by position, time split", 600), label="Per-step dynamics",
                       elem_id="explore-dynamics")
    with gr.Accordion("Step through the run: narration and the verification microscope", open=True):
        panel = build_step_panel("explore", TOKENS_ID)
        with gr.Row(equal_height=True):
            speed = gr.Dropdown(list(SPEEDS), value=1, label="Replay speed (× real time)", elem_id="explore-replay-speed", scale=0,
                                min_width=160)
            replay_btn = gr.Button("Replay the run against AR", elem_id="explore-replay", scale=0, min_width=220)
            present = gr.Checkbox(False, label="Presentation mode (large type for projectors)", elem_id="explore-present")
    table = gr.Dataframe(step_table(), label=f"Steps (reasons: {REASON_LEGEND})", interactive=False, max_height=320,
                         elem_id="explore-steps", wrap=False)
    with gr.Accordion("Traces: save this run, open a saved one or an example (no model needed)", open=True):
        with gr.Row(equal_height=False):
            trace_file = gr.File(label="This run as a trace file (.json)", interactive=False, elem_id="explore-trace-file")
            html_file = gr.File(label="This run as one HTML page (works offline)", interactive=False, elem_id="explore-html-file")
            upload = gr.File(label="Open a trace file", file_types=[".json"], type="filepath", elem_id="explore-trace-upload")
        with gr.Row(equal_height=True):
            example = gr.Dropdown(list(gallery()), value=None, label="Example traces (recorded on the offline preset)",
                                  elem_id="explore-examples")
            example_btn = gr.Button("Open example", elem_id="explore-open-example", scale=0, min_width=160)
    outputs = [status, headline, tokens, race, dynamics, table, session, *panel.outputs(), trace_file, html_file]
    wire_decode_controls(controls, hint)
    wire_step_panel(panel, session, VIEW)
    upload.upload(open_trace, [upload, session], outputs, api_visibility="private")
    example_btn.click(open_example, [example, session], outputs, api_visibility="private")
    replay_btn.click(replay_run, [speed, session], [tokens, race, *panel.outputs()], api_visibility="private", show_progress="hidden")
    present.change(None, present, None, js="(on) => { document.body.classList.toggle('sv-present', on); }")
    event = run_btn.click(explore_run, [prompt, *controls.inputs(), baseline, session],
                          outputs,
                          api_name="explore_run", concurrency_id="decode", concurrency_limit=decode_concurrency(),
                          show_progress="hidden")
    stop_btn.click(None, None, None, cancels=[event])
    stop_btn.click(explore_stopped, session, status, api_visibility="private", queue=False)
    return controls
