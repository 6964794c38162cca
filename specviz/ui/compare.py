"""Compare tab: 2–4 configurations on the same prompt and seed, run one after another (after a short
warm-up, order rotated per round, AR included), shown as synchronised token columns, one race chart,
a metrics table and CSV / JSON exports of every step. The comparison itself is :mod:`specviz.ui.comparison`."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import gradio as gr
import pandas as pd

from specviz.analysis.result import result_of
from specviz.api.server import server_trace
from specviz.api.trace import Trace, trace_of
from specviz.core.errors import ConfigError, ServerError
from specviz.models.vllm_client import DEFAULT_TIMEOUT_S
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import BASELINE_SETTINGS, baseline_config, plan
from specviz.ui.bank import LOADING_MESSAGE, Models, default_preset, shared_models
from specviz.ui.comparison import (
    GENERATE_LABEL,
    METRIC_COLUMNS,
    ROW_SETTINGS,
    SERVER_COMPARISON,
    SERVER_LABEL,
    SERVER_SPEC,
    SETTINGS,
    Comparison,
    columns_at,
    comparison_presets,
    default_table,
    export,
    metrics_table,
    parse_table,
    save_column_traces,
    table_of,
    view_key,
)
from specviz.ui.controls import UI_MAX_NEW_TOKENS, SettingsForm, form_handler
from specviz.ui.decode import decode_steps
from specviz.ui.handlers import decode_concurrency, default_prompt, example_prompts, guarded, time_generate_or_error
from specviz.ui.runs import AR_LABEL, CHARTS_EVERY_S, REDRAW_EVERY_S, Every, Live, put_baseline, run_record
from specviz.ui.server import DEFAULT_URL, streamed
from specviz.ui.state import ensure_session
from specviz.ui.teach import build_step_panel, view_update, wire_step_panel
from specviz.viz import charts
from specviz.viz.render import GENERATE, spans_html, status_html

WARMUP_TOKENS = 4


def frame(status=None, columns=None, race=None, metrics=None, replay=None, csv_file=None, json_file=None, session=None,
          column=None, traces=None) -> tuple:
    values = (status, columns, race, metrics, replay, csv_file, json_file, session, column, traces)
    return tuple(gr.skip() if v is None else v for v in values)


def _time_generate(models: Models, comp: Comparison, rnd: int) -> Iterator[tuple]:
    """One round of transformers' generate (no steps to stream: its column shows its text once it has finished); after a
    failure, which its column and the final status show, its later rounds are skipped."""
    if comp.generate_error:
        return
    yield frame(status=_progress(comp, GENERATE_LABEL, rnd, 0))
    config = comp.configs[GENERATE_LABEL]
    timing = yield from time_generate_or_error(config, comp.prompt, frame())
    if "error" in timing:
        comp.generate_error = timing["error"]
        yield frame(columns=comp.columns())
        return
    text = plan(config, comp.prompt, models.bank).tokenizer.decode(timing["token_ids"], skip_special_tokens=True)
    comp.rounds[GENERATE_LABEL].append({"label": GENERATE_LABEL, "config": config.to_dict(), "events": [], "text": text,
                                        "metrics": {k: timing[k] for k in ("new_tokens", "wall_s", "tokens_per_s")},
                                        "token_ids": timing["token_ids"], "round": rnd + 1, "order": len(comp.order) + 1})
    comp.order.append(f"{GENERATE_LABEL}#{rnd + 1}")
    if rnd == 0:
        yield frame(columns=comp.columns(), race=comp.race())


def _run_server(comp: Comparison, rnd: int, session: dict) -> Iterator[tuple]:
    """One round on the vLLM server, streamed (its first round draws its column as the answer arrives, then its steps);
    after a failure, which its column and the final status show, its later rounds are skipped."""
    if comp.server_error:
        return
    server, config, chunks, text = comp.server, comp.configs[SERVER_LABEL], [], ""
    started = time.perf_counter()
    run = partial(server_trace, comp.prompt, server["url"], server["model"], config, DEFAULT_TIMEOUT_S, server["spec"])
    try:
        for got in streamed(run):
            if isinstance(got, Trace):
                trace = got
                break
            chunks.append([time.perf_counter() - started, got[0], html.escape(got[1][len(text):])])  # the text it added
            text = got[1]
            if rnd == 0:
                comp.server_chunks = chunks
            yield frame(status=_progress(comp, SERVER_LABEL, rnd, got[0]), columns=comp.columns() if rnd == 0 else None)
    except (ServerError, ConfigError) as exc:
        comp.server_error = str(exc)
        yield frame(columns=comp.columns())
        return
    data = trace.to_dict()
    comp.rounds[SERVER_LABEL].append(run_record(SERVER_LABEL, config, data["steps"], data, round=rnd + 1, order=len(comp.order) + 1))
    comp.order.append(f"{SERVER_LABEL}#{rnd + 1}")
    if rnd == 0:  # its tokens as they arrived (for the race), then its steps' spans in place of the streamed text
        comp.server_chunks = [[t, n, ""] for t, n, _ in chunks] + [[time.perf_counter() - started, len(trace.token_ids),
                                                                     spans_html(trace.spans)]]
        comp.views[SERVER_LABEL] = {**data, "follow": True,
                                    "selector": f"#compare-columns .sv-col:nth-child({comp.labels.index(SERVER_LABEL) + 1})"}
        session["views"][view_key(SERVER_LABEL)] = comp.views[SERVER_LABEL]
        yield frame(columns=comp.columns(), race=comp.race())


def _run_one(models: Models, comp: Comparison, label: str, rnd: int, session: dict) -> Iterator[tuple]:
    """Stream one configuration; its first round updates its column live."""
    if label == GENERATE_LABEL:
        yield from _time_generate(models, comp, rnd)
        return
    if label == SERVER_LABEL:
        yield from _run_server(comp, rnd, session)
        return
    config = comp.configs[label]
    run = plan(config, comp.prompt, models.bank)
    live = Live(run, label)
    if rnd == 0:
        comp.lives[label] = live
        view = comp.views[label] = {**live.view, "selector": f"#compare-columns .sv-col:nth-child({comp.labels.index(label) + 1})"}
        session["views"][view_key(label)] = view
    redraw, redraw_chart = Every(REDRAW_EVERY_S), Every(CHARTS_EVERY_S, at_once=False)
    for _ in live.stream(comp.prompt):
        if redraw.due():  # later rounds only report progress; the columns show round 1
            race = columns = None
            if rnd == 0:
                columns = comp.columns()
                race = comp.race() if redraw_chart.due() else None
            yield frame(status=_progress(comp, label, rnd, live.new_tokens), columns=columns, race=race)
    record = run_record(label, config, live.builder.events, result_of(run, live.events), round=rnd + 1, order=len(comp.order) + 1)
    if rnd == 0:
        comp.views[label] = {**trace_of(comp.prompt, run, live.events).to_dict(), "follow": True, "selector": view["selector"]}
    comp.rounds[label].append(record)
    comp.order.append(f"{label}#{rnd + 1}")
    if label == AR_LABEL:
        put_baseline(session, config, comp.prompt, {**record, "measured": "in a comparison"})


def _progress(comp: Comparison, label: str, rnd: int, tokens: int) -> str:
    return status_html(f"Round {rnd + 1}: running '{label}' ({len(comp.order) + 1} of {len(comp.labels) * comp.n_rounds}): "
                       f"{tokens}/{comp.configs[label].max_new_tokens} tokens…", "busy")


def _warm_up(models: Models, comp: Comparison) -> None:
    """A few tokens through every configuration first, so no run pays a first-call cost."""
    for label in comp.labels:
        if label == SERVER_LABEL:  # the server warmed itself up when it started
            continue
        models.load_weights(comp.configs[label])
        if label == GENERATE_LABEL:  # its timing warms itself up
            continue
        for _ in decode_steps(replace(comp.configs[label], max_new_tokens=WARMUP_TOKENS).validate(), comp.prompt):
            pass


def server_column(url: str | None, model: str | None, spec: str | None) -> dict | None:
    """The server a comparison runs as a column (None without a URL); its speculative config is JSON where given."""
    if not url or not url.strip():
        return None
    try:
        speculative = json.loads(spec) if spec and spec.strip() else None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the server's speculative config is not JSON ({exc.msg})") from None
    return {"url": url.strip(), "model": (model or "").strip() or None, "spec": speculative}


def compare_frames(models: Models, prompt: str, table, shared: dict, repeats: int, session: dict,
                   transformers: bool = False, server: dict | None = None) -> Iterator[tuple]:
    """Warm up, then ``repeats`` rounds of AR, (with ``transformers``, transformers' generate; with ``server``, a vLLM
    server: :func:`server_column`) and every configuration of ``table``, order rotated per round; then the metrics and
    exports."""
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty: type a prompt or pick an example")
    if not 1 <= repeats <= 5:
        raise ConfigError(f"rounds must be between 1 and 5, got {repeats}")
    configs = parse_table(table, shared)
    live = session["live"] = {"running": True, "kind": "compare", "done": 0}
    peers = [AR_LABEL, *([GENERATE_LABEL] if transformers else []), *([SERVER_LABEL] if server else [])]
    labels = peers + [label for label, _ in configs]
    shared_config = baseline_config(configs[0][1])  # the server decodes with its own speculation, on the same settings
    peer_configs = {**dict.fromkeys(peers, shared_config), SERVER_LABEL: replace(shared_config, method="sd").validate()}
    comp = Comparison(prompt, labels, {**{p: peer_configs[p] for p in peers}, **dict(configs)}, repeats, server)
    choices = [(label, view_key(label)) for label in labels if label != GENERATE_LABEL]  # it has no steps to step through
    yield frame(status=status_html("Warming up every configuration (a few tokens each)…" if all(models.is_loaded(c) for _, c in configs)
                                   else LOADING_MESSAGE, "busy"), columns=comp.columns(), race=charts.empty_figure("waiting…"),
                metrics=pd.DataFrame(columns=METRIC_COLUMNS), replay=gr.update(value=0, maximum=1),
                column=gr.update(choices=choices, value=choices[-1][1]))
    _warm_up(models, comp)
    for rnd in range(repeats):
        rotated = labels[rnd % len(labels):] + labels[: rnd % len(labels)]
        for label in rotated:
            yield from _run_one(models, comp, label, rnd, session)
            live["done"] = len(comp.order)
    live["running"] = False
    session["compare"] = {"prompt": prompt, "labels": labels, "order": comp.order, "chunks": comp.chunks(),
                          "descriptions": comp.descriptions()}
    csv_path, json_path = export(comp, shared, WARMUP_TOKENS)
    traces = save_column_traces(comp, session)
    order = " → ".join(comp.order)
    end = comp.max_time()
    failed = (f" {GENERATE} failed, so it has no row: {comp.generate_error}." if comp.generate_error else "") + (
        f" The vLLM server failed, so it has no row: {comp.server_error}" if comp.server_error else "")
    yield frame(status=status_html(f"Done: {len(comp.order)} runs after a {WARMUP_TOKENS}-token warm-up each. Run order: {order}. "
                                   f"Drag the time slider to replay every column in sync.{failed} Ran on {models.machine(configs[0][1])}.",
                                   "warn" if failed else "ok"),
                columns=comp.columns(), race=comp.race(), metrics=metrics_table(comp),
                replay=gr.update(value=round(end, 2), maximum=max(0.01, round(end + 0.005, 2)), interactive=True),
                csv_file=str(csv_path), json_file=str(json_path), session=session, traces=traces)


def compare_run(prompt: str, configs: pd.DataFrame, rounds: float, transformers: bool, session: dict | None,
                server_url: str | None = None, server_model: str | None = None, server_spec: str | None = None,
                **shared) -> Iterator[tuple]:
    """Run every configuration and AR (and with ``transformers``, transformers' generate; with ``server_url``, that
    vLLM server) on the same prompt and ``shared`` settings (those the AR baseline reads); stream columns, chart,
    metrics, exports."""
    session = ensure_session(session)

    def frames() -> Iterator[tuple]:
        n = int(rounds) if rounds is not None and float(rounds) == int(rounds) else -1
        server = server_column(server_url, server_model, server_spec)
        yield from compare_frames(shared_models(), prompt, configs, shared, n, session, bool(transformers), server)

    def on_error(message: str) -> tuple:
        session["live"]["running"] = False
        return frame(status=status_html(message, "error"), session=session)

    yield from guarded(frames, on_error)


def compare_stopped(session: dict | None) -> str:
    """Status after Stop in the Compare tab."""
    live = (session or {}).get("live") or {}
    if not live.get("running") or live.get("kind") != "compare":
        return gr.skip()
    return status_html(f"Comparison stopped after {live.get('done', 0)} finished runs; the columns so far are kept, "
                       "no metrics or exports were made.", "stopped")


def compare_replay(at_s: float, session: dict | None) -> str:
    """The columns as they were ``at_s`` seconds into each run (first round): a synchronised replay."""
    data = (session or {}).get("compare")
    if not data:
        return gr.skip()
    return columns_at(data["labels"], data["chunks"], data["descriptions"], float(at_s or 0.0))


def table_help() -> str:
    """What the configuration table's columns take, from the settings."""
    choices = [f"{SETTINGS[n].label}: {' '.join(f'`{o}`' for o in SETTINGS[n].options())}" for n in ROW_SETTINGS
               if SETTINGS[n].choices is not None]
    return ("**Configurations** (2–4 rows; edit cells, add or delete rows; an empty cell is the setting's default). A list (chain, "
            "selection) is comma-separated, a chain fastest first (the target verifies last). " + "; ".join(choices) +
            f". The AR baseline always runs too, and {GENERATE} unless unticked.")


def build_compare_tab(session: gr.State) -> None:
    """The Compare tab's layout and events (inside a Blocks context)."""
    rows, labels = example_prompts()
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(default_prompt(), lines=3, label="Prompt (shared by every configuration)", elem_id="compare-prompt")
            if rows:
                gr.Examples(rows, [prompt], label="Example prompts", example_labels=labels, examples_per_page=6)
        with gr.Column(scale=2):
            form = SettingsForm("compare")
            form.add(["preset", "max_new_tokens"], max_new_tokens={"value": 48, "maximum": UI_MAX_NEW_TOKENS})
            with gr.Accordion("Shared by every row: temperature, top-p, seed, chat template and the target", open=False):
                form.add(BASELINE_SETTINGS)
            rounds = gr.Slider(1, 5, value=1, step=1, label="Rounds (order rotated each round; metrics are medians)")
            transformers = gr.Checkbox(True, label=f"{GENERATE} as a column too, timed in the same rounds as AR on its stock kernels "
                                       "(on by default; one more run per round)", elem_id="compare-transformers")
            hint = gr.HTML("", elem_id="compare-hint")
    gr.Markdown(table_help())
    with gr.Row():
        loader = gr.Dropdown([*comparison_presets(default_preset()), SERVER_COMPARISON], value=None,
                             label="Load a ready-made comparison", scale=1)
        every = gr.Checkbox(False, label="Every setting as a column", scale=0, elem_id="compare-every")
    with gr.Accordion("A vLLM server as a column: its speculation on the same prompt, beside specviz's", open=False):
        with gr.Row():
            server_url = gr.Textbox("", label="Server URL (empty: no server column)", placeholder=DEFAULT_URL,
                                    elem_id="compare-server-url")
            server_model = gr.Textbox("", label="Model", placeholder="the server's only model")
        server_spec = gr.Textbox("", label="The server's speculative config (JSON; needed to place an n-gram server's steps)",
                                 elem_id="compare-server-spec")
    table = gr.Dataframe(default_table(form.preset), interactive=True, label="Configurations", elem_id="compare-configs")
    with gr.Row():
        run_btn = gr.Button("Run comparison", variant="primary", elem_id="compare-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    status = gr.HTML(status_html("Edit the configurations and press Run comparison.", "info"), label="Status", elem_id="compare-status")
    replay = gr.Slider(0, 1, value=0, step=0.01, label="Replay: every column as it was this many seconds after its Run (synchronised)",
                       interactive=False, elem_id="compare-replay")
    columns = gr.HTML("", label="Token columns", elem_id="compare-columns")
    race = gr.Plot(charts.empty_figure("Press Run comparison: every configuration and AR, tokens vs time"),
                   label="All configurations against AR", elem_id="compare-race")
    metrics = gr.Dataframe(pd.DataFrame(columns=METRIC_COLUMNS), label="Metrics (medians over rounds)", interactive=False,
                           elem_id="compare-metrics")
    with gr.Accordion("Step through a column: narration and the verification microscope", open=False):
        column = gr.Dropdown([], value=None, label="Column", elem_id="compare-column")
        panel = build_step_panel("compare", "compare-columns")
    with gr.Row():
        csv_file = gr.File(label="Steps of every run (CSV)", interactive=False, elem_id="compare-csv")
        json_file = gr.File(label="Whole comparison (JSON)", interactive=False, elem_id="compare-json")
        traces = gr.File(label="Each column as a trace file", file_count="multiple", interactive=False, elem_id="compare-traces")
    form.wire(hint)
    wire_step_panel(panel, session, column)
    column.change(lambda key, session: view_update(ensure_session(session)["views"].get(key), None, "compare-columns"),
                  [column, session], panel.outputs(), api_visibility="private", queue=False)
    loader.change(load_comparison, [loader, form.controls["preset"], every], [table, server_url, server_spec],
                  api_visibility="private", queue=False)
    every.change(show_columns, [table, every, form.controls["preset"]], table, api_visibility="private", queue=False)
    event = run_btn.click(form_handler(compare_run, ["prompt", "configs", "rounds", "transformers", "session"], form,
                                       ["server_url", "server_model", "server_spec"]),
                          [prompt, table, rounds, transformers, session, *form.inputs(), server_url, server_model, server_spec],
                          [status, columns, race, metrics, replay, csv_file, json_file, session, column, traces],
                          api_name="compare_run", concurrency_id="decode", concurrency_limit=decode_concurrency(),
                          show_progress="hidden")
    stop_btn.click(None, None, None, cancels=[event])
    stop_btn.click(compare_stopped, session, status, api_visibility="private", queue=False)
    replay.release(compare_replay, [replay, session], columns, api_name="compare_replay")


def load_comparison(name: str | None, preset: str, every: bool = False) -> tuple:
    """A ready-made comparison's table for ``preset`` (its first one when this preset has no such comparison), and the
    server column's URL and config (filled by the comparison with a server, left as they are by the others)."""
    if not name:
        return gr.skip(), gr.skip(), gr.skip()
    if name == SERVER_COMPARISON:
        row = DecodeConfig(preset=preset, draft="draft-m", gamma=3, gamma_policy="fixed")
        return table_of([("specviz draft-m γ=3", row)], every), DEFAULT_URL, json.dumps(SERVER_SPEC)
    tables = comparison_presets(preset)
    return table_of(tables.get(name) or next(iter(tables.values())), every), gr.skip(), gr.skip()


def show_columns(table: pd.DataFrame, every: bool, preset: str) -> pd.DataFrame:
    """The same rows with every setting as a column, or only the settings they read; a table that does not parse stays
    as it is, and the reason shows as a warning."""
    try:
        return table_of(parse_table(table, {"preset": preset}), every)
    except ConfigError as exc:
        gr.Warning(str(exc))
        return gr.skip()
