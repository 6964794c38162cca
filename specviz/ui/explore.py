"""Explore tab: one live run, streamed step by step and raced against the autoregressive baseline.

The speculative run streams first (first tokens within a second of Run once models are loaded); the AR
baseline for the same prompt and settings is then measured right after it (or before it, or reused from
this session's cache) and added to the charts, and the headline says which. Live views redraw a few times a
second, the charts less often, so the browser does not take the cores the decode runs on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gradio as gr
import pandas as pd

from specviz.analysis.result import result_of
from specviz.api.trace import Trace, read_trace, trace_of
from specviz.bench.harness import GENERATE_KERNELS, generate_figure
from specviz.core.errors import ConfigError
from specviz.models.paths import ASSETS
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import BASELINE_SETTINGS, baseline_config, plan
from specviz.ui.bank import LOADING_MESSAGE, Models, shared_models
from specviz.ui.controls import UI_MAX_NEW_TOKENS, SettingsForm, form_handler
from specviz.ui.handlers import decode_concurrency, default_prompt, example_prompts, guarded, time_generate_or_error
from specviz.ui.runs import (
    AR_LABEL,
    CHARTS_EVERY_S,
    REDRAW_EVERY_S,
    Every,
    Live,
    get_baseline,
    headline,
    put_baseline,
    run_dynamics,
    run_race,
    run_record,
    save_trace_files,
)
from specviz.ui.state import ensure_session, form_config
from specviz.ui.teach import build_step_panel, live_panel, view_update, wire_step_panel
from specviz.viz import charts
from specviz.viz.export import SPEEDS, race_series, trace_headline
from specviz.viz.export import run_label as trace_label
from specviz.viz.render import GENERATE, REASON_LEGEND, TokenSpan, headline_html, legend_html, serving_html, spans_html, status_html
from specviz.viz.trace import STEP_COLUMNS, step_row

VIEW, TOKENS_ID = "explore", "explore-tokens"
"""The step panel's view key in the session, and the token view it marks."""
GALLERY = ASSETS / "traces"
PRIMARY = ("preset", "method", "draft", "gamma_policy", "gamma", "accept", "max_new_tokens")
"""The settings shown first; every other one is in the accordions below them."""
BASELINE_AFTER, BASELINE_BEFORE, BASELINE_SKIP = "after the run", "before the run", "skip"
NO_CHART = gr.update(value=None)
"""A chart cleared for a new run (no figure to draw while the run starts)."""
TOKENS = 64
"""Explore's default max new tokens."""
PAGE_SETTLE_S = 0.2
"""How long a run waits after clearing the page before a timed decode starts, so the browser's redraw of the cleared
views does not share the cores with the decode's first steps."""
TRANSFORMERS_LABEL = (f"Also time {GENERATE} with the AR baseline: the speedup over the library itself, on its stock kernels "
                      "(on by default; one more decode of the same length per new prompt and settings, then reused)")
PLACEHOLDER = ('<span class="sv-placeholder">Generated tokens stream here, one marked span per token: hover a token for its step, '
               'p (target), q (draft) and judge score.</span>')


def frame(status=None, headline=None, tokens=None, race=None, dynamics=None, table=None, session=None, panel=None, files=None,
          serving=None) -> tuple:
    """One update of the Explore outputs; ``None`` leaves an output as it is. ``panel``: the step panel's (step,
    narration, microscope); ``files``: the saved trace and HTML page; ``serving``: the run's export to serving engines."""
    values = (status, headline, tokens, race, dynamics, table, session, *(panel or (None,) * 3), *(files or (None,) * 2), serving)
    return tuple(gr.skip() if v is None else v for v in values)


def step_table(rows: list[list] | None = None) -> pd.DataFrame:
    return pd.DataFrame(rows or [], columns=STEP_COLUMNS)


def _measure_ar(models: Models, config: DecodeConfig, prompt: str, session: dict, when: str,
                shown: list[charts.Series]) -> Iterator[tuple]:
    """Stream the AR baseline (chart and status only); stores it in the session cache and returns it."""
    cfg = baseline_config(config)
    ar_plan = plan(cfg, prompt, models.bank)
    live, redraw = Live(ar_plan, AR_LABEL), Every(CHARTS_EVERY_S, at_once=False)
    for _ in live.stream(prompt):
        if redraw.due():
            race = charts.race_figure(shown + [live.series(baseline=True, note=f"measuring {when}…")])
            yield frame(status=status_html(f"Measuring the AR baseline {when} (same prompt and settings): "
                                           f"{live.builder.new_tokens}/{cfg.max_new_tokens} tokens…", "busy"), race=race)
    record = run_record(AR_LABEL, cfg, live.builder.events, result_of(ar_plan, live.events), measured=when,
                        run=session["runs"], trace=trace_of(prompt, ar_plan, live.events).to_dict())
    put_baseline(session, config, prompt, record)
    return record


def _measure_generate(config: DecodeConfig, prompt: str, session: dict, ar: dict) -> Iterator[tuple]:
    """Time transformers' generate beside the AR baseline ``ar`` (a run record): kept with it in the session cache (a
    failure too, as its message, until a later run tries again); returns the record."""
    yield frame(status=status_html(f"Timing {GENERATE} on the same target, prompt and settings ({GENERATE_KERNELS})…", "busy"))
    timing = yield from time_generate_or_error(config, prompt, frame())
    figure = timing if "error" in timing else generate_figure(timing, ar["token_ids"], config.temperature > 0)
    ar = {**ar, "transformers": figure}
    put_baseline(session, config, prompt, {k: v for k, v in ar.items() if k != "reused"})
    return ar


def _generate_shown(ar: dict | None, timed: bool) -> dict | None:
    """The transformers card's content while a run streams (if it will be ``timed``): the measurement cached with ``ar``,
    or when it comes."""
    if not timed:
        return None
    cached = (ar or {}).get("transformers") or {}
    return cached if cached.get("tokens_per_s") else {"note": f"{GENERATE} is timed after the run"}


def _baseline_note(ar: dict | None, mode: str, method: str) -> str:
    if method == "ar":
        return "this run is the AR baseline"
    if ar is None:
        return "AR baseline skipped" if mode == BASELINE_SKIP else "measuring the AR baseline next"
    if ar.get("reused"):
        return f"AR measured at {ar['finished_at']} ({ar['measured']}), reused: same prompt and settings"
    return f"AR measured {ar['measured']}, same prompt and settings"


def explore_frames(models: Models, prompt: str, config: DecodeConfig, baseline: str, session: dict,
                   transformers: bool = False) -> Iterator[tuple]:
    """The Explore handler's body: load, (AR before), stream the run, (AR after), (transformers' generate, with
    ``transformers``, once per AR baseline), final numbers."""
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty: type a prompt or pick an example")
    session["runs"] += 1
    live_info = session["live"] = {"running": True, "tokens": 0, "run": session["runs"]}
    run = plan(config, prompt, models.bank)
    if not models.is_loaded(config):
        yield frame(status=status_html(LOADING_MESSAGE, "busy"))
    models.load_weights(config)
    cached = get_baseline(session, config, prompt) if config.method == "sd" else None
    ar = {**cached, "reused": True} if cached else None
    cleared = dict(tokens="", table=step_table(), race=NO_CHART, dynamics=NO_CHART, headline="", session=session)
    if ar is None and config.method == "sd" and baseline == BASELINE_BEFORE:
        yield from _before_decode(frame(status=status_html("Measuring the AR baseline first…", "busy"), **cleared))
        ar = yield from _measure_ar(models, config, prompt, session, "before the run", [])
        cleared.pop("race")
    live = Live(run)
    session["views"][VIEW] = live.view
    yield from _before_decode(frame(status=status_html(f"Decoding: {live.label}: prefilling {len(run.prompt_ids)} prompt tokens…", "busy"),
                                    panel=view_update(None, None, TOKENS_ID), **cleared))
    timed = transformers and (config.method == "ar" or ar is not None or baseline != BASELINE_SKIP)
    yield from _stream_main(live, prompt, config, ar, _baseline_note(ar, baseline, config.method), live_info,
                            _generate_shown(ar, timed))
    result = result_of(run, live.events)
    record = run_record(live.label, config, live.builder.events, result, prompt=prompt, run=session["runs"])
    peer = ar  # the AR baseline transformers' generate is timed beside: this run itself when it is AR
    if config.method == "ar":
        peer = {**record, "label": AR_LABEL, "measured": f"as Explore run #{session['runs']}"}
        put_baseline(session, config, prompt, peer)
    elif ar is None and baseline == BASELINE_AFTER:
        ar = peer = yield from _measure_ar(models, config, prompt, session, "after the run", [live.series()])
    if transformers and peer is not None and not (peer.get("transformers") or {}).get("tokens_per_s"):
        peer = yield from _measure_generate(config, prompt, session, peer)
        ar = peer if config.method == "sd" else None
    session["last"] = {**record, "ar": ar and {"metrics": ar["metrics"], "token_ids": ar["token_ids"]}}
    machine = models.machine(config)
    trace = trace_of(prompt, run, live.events, machine).to_dict()
    trace["baseline"] = ar.get("trace") if ar and config.method == "sd" else None
    figure = peer.get("transformers") if transformers and peer else None
    if figure:
        trace["transformers"] = figure
    session["views"][VIEW] = {**trace, "follow": True}
    live_info["running"] = False
    yield _final_frame(live, config, ar, baseline, session, result, trace, figure)


def _before_decode(cleared: tuple) -> Iterator[tuple]:
    """Show a frame that clears the page, then give the browser PAGE_SETTLE_S to draw it before a timed decode."""
    yield cleared
    time.sleep(PAGE_SETTLE_S)


def _stream_main(live: Live, prompt: str, config: DecodeConfig, ar: dict | None, note: str, live_info: dict,
                 generate: dict | None = None) -> Iterator[tuple]:
    """The run's frames while it streams: at most one per REDRAW_EVERY_S; the race chart and the step panel once every
    CHARTS_EVERY_S (none in a run shorter than that); the per-step charts and the step table, the costliest to draw,
    wait for the final frame, which shows everything."""
    redraw, redraw_race = Every(REDRAW_EVERY_S), Every(CHARTS_EVERY_S, at_once=False)
    for _ in live.stream(prompt):
        live_info["tokens"] = live.new_tokens
        if not redraw.due():
            continue
        race = panel = None
        if redraw_race.due():
            race, panel = run_race(live, ar, note), live_panel(live.view, TOKENS_ID)
        done = f"{live.new_tokens}/{config.max_new_tokens}"
        status = status_html(f"Decoding: {live.label}: step {len(live.events)}, {done} tokens…", "busy")
        yield frame(status=status, headline=headline(live.metrics(), config, ar, note + " (so far)", generate), tokens=live.tokens_html,
                    race=race, panel=panel)


def _generate_sentence(figure: dict | None) -> str:
    if not figure:
        return ""
    if figure.get("error"):
        return f" {GENERATE} failed, so there is no speedup over it: {figure['error']}."
    return f" {GENERATE}: {figure['tokens_per_s']:.1f} tok/s, timed on {figure['kernels']}."


def _final_frame(live: Live, config: DecodeConfig, ar: dict | None, baseline: str, session: dict, result: dict, trace: dict,
                 generate: dict | None = None) -> tuple:
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
               f"{note[0].upper() + note[1:]}.{same}{_generate_sentence(generate)} Ran on {trace['machine']}.")
    race, dyn = run_race(live, ar, note, generate), run_dynamics(live, ar)
    level = "warn" if generate and generate.get("error") else "ok"
    return frame(status=status_html(message, level), headline=headline(metrics, config, ar, note, generate), tokens=live.tokens_html,
                 race=race, dynamics=dyn, table=step_table(live.builder.rows), session=session,
                 panel=view_update(trace, None, TOKENS_ID), files=save_trace_files(trace), serving=serving_html(trace["serving"]))


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
                       "finished_at": "", "speedup": trace.speedup,
                       "ar": data["baseline"] and {"metrics": data["baseline"]["metrics"], "token_ids": data["baseline"]["token_ids"]}}
    base = data["baseline"]
    dyn = charts.dynamics_figure(charts.dynamics_from_events(data["steps"], data["metrics"], base["metrics"] if base else None))
    rows = [step_row(e, [s for s in trace.spans if s.step == e["step"]]) for e in data["steps"]]
    models = trace.models
    status = (f"Loaded trace '{name}': {trace_label(data['config'])}; target {models.get('target', '?')}, recorded on "
              f"{trace.machine or 'an unknown machine'}. Every view works without a model: step through it, replay it.")
    return frame(status=status_html(status, "ok"), headline=headline_html(trace_headline(data)), tokens=spans_html(trace.spans),
                 race=charts.race_figure(race_series(data)), dynamics=dyn, table=step_table(rows), session=session,
                 panel=view_update(data, None, TOKENS_ID), serving=serving_html(data["serving"]))


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
    speed = min(max(SPEEDS), max(min(SPEEDS), float(speed or 1)))
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


def explore_run(prompt: str, baseline: str, transformers: bool, session: dict | None, **settings) -> Iterator[tuple]:
    """Stream one run of ``settings`` (DecodeConfig's names): status, headline, token spans, race chart, per-step
    charts, step table; with ``transformers``, transformers' generate is timed beside the AR baseline."""
    session = ensure_session(session)

    def frames() -> Iterator[tuple]:
        yield from explore_frames(shared_models(), prompt, form_config(settings), baseline or BASELINE_AFTER, session,
                                  bool(transformers))

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


def build_explore_tab(session: gr.State) -> SettingsForm:
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
            transformers = gr.Checkbox(True, label=TRANSFORMERS_LABEL, elem_id="explore-transformers")
            status = gr.HTML(status_html("Pick a prompt and press Run.", "info"), label="Status", elem_id="explore-status")
        with gr.Column(scale=2):
            form = SettingsForm("explore")
            form.add(PRIMARY, max_new_tokens={"value": TOKENS, "maximum": UI_MAX_NEW_TOKENS})
            with gr.Accordion("Sampling (temperature, top-p, seed, chat template) and the target", open=False):
                form.add(BASELINE_SETTINGS)
            with gr.Accordion("Polybasic chain, draft selection and more", open=False):
                form.add(DecodeConfig.settings())
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
        serving = gr.HTML(status_html("After a run: its speculation as vLLM's --speculative-config and SGLang's flags.", "info"),
                          elem_id="explore-serving")
    outputs = [status, headline, tokens, race, dynamics, table, session, *panel.outputs(), trace_file, html_file, serving]
    form.wire(hint)
    wire_step_panel(panel, session, VIEW)
    upload.upload(open_trace, [upload, session], outputs, api_visibility="private")
    example_btn.click(open_example, [example, session], outputs, api_visibility="private")
    replay_btn.click(replay_run, [speed, session], [tokens, race, *panel.outputs()], api_visibility="private", show_progress="hidden")
    present.change(None, present, None, js="(on) => { document.body.classList.toggle('sv-present', on); }")
    event = run_btn.click(form_handler(explore_run, ["prompt"], form, ["baseline", "transformers", "session"]),
                          [prompt, *form.inputs(), baseline, transformers, session],
                          outputs,
                          api_name="explore_run", concurrency_id="decode", concurrency_limit=decode_concurrency(),
                          show_progress="hidden")
    stop_btn.click(None, None, None, cancels=[event])
    stop_btn.click(explore_stopped, session, status, api_visibility="private", queue=False)
    return form
