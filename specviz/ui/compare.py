"""Compare tab: 2–4 configurations on the same prompt and seed, run one after another (after a short
warm-up, order rotated per round, AR included), shown as synchronised token columns, one race chart,
a metrics table and CSV / JSON exports of every step."""

from __future__ import annotations

import csv
import json
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gradio as gr
import pandas as pd

from specviz.analysis.result import result_of
from specviz.api import Trace, token_pieces, trace_of
from specviz.core.engine import StepEvent
from specviz.core.errors import ConfigError
from specviz.models.presets import NGRAM_DRAFT, resolve_draft, resolve_preset
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import drafter_kind, plan
from specviz.ui.bank import LOADING_MESSAGE, Models, available_drafts, default_draft, shared_models
from specviz.ui.controls import (
    decode_concurrency,
    default_prompt,
    example_prompts,
    guarded,
    max_tokens_slider,
    preset_dropdown,
    sampling_controls,
)
from specviz.ui.decode import decode_steps
from specviz.ui.explore import AR_LABEL, ar_config
from specviz.ui.exports import export_folder
from specviz.ui.state import baseline_key, ensure_session, make_config, put_baseline, run_record
from specviz.ui.teach import build_step_panel, view_update, wire_step_panel
from specviz.viz import charts
from specviz.viz.render import column_html, columns_html, spans_html, status_html
from specviz.viz.trace import TraceBuilder

CONFIG_COLUMNS = ["label", "method", "draft", "γ", "γ policy", "accept", "δ", "lenience", "top-k"]
MAX_CONFIGS = 4
WARMUP_TOKENS = 4
CHART_EVERY_S = 0.75
COLUMNS_EVERY_S = 0.15
METRIC_COLUMNS = ["config", "run order", "new tokens", "wall s", "tok/s", "speedup vs AR", "mean accepted len", "accept rate",
                  "draft ms", "verify ms", "overhead ms", "same tokens as AR"]


def comparison_presets(preset: str) -> dict[str, list[list]]:
    """Ready-made tables for the 'load a comparison' dropdown, at the default γ; a chain needs a draft model (a
    feature head drafts from the target's states, so it cannot be a level)."""
    d, g = default_draft(preset), DecodeConfig.gamma
    row = lambda label, draft=d, g=g, policy="fixed", accept="exact": [label, "sd", draft, g, policy, accept, 0.5, 1.0, 5]
    first = [row(f"{d} γ={g}"), row(f"ngram γ={g}", "ngram")] if d != "ngram" else [row(f"ngram γ={g}"), row("ngram γ=8", g=8)]
    models = [x for x in available_drafts(preset) if not drafter_kind(resolve_draft(resolve_preset(preset), x)).reads_features]
    chain_draft = next((x for x in models if x != NGRAM_DRAFT), None)
    tables = {
        f"draft vs n-gram (γ={g})": first,
        f"γ sweep (1, {g}, 6)": [row(f"{d} γ=1", g=1), row(f"{d} γ={g}"), row(f"{d} γ=6", g=6)],
        "fixed vs adaptive γ (online)": [row(f"fixed γ={g}"), row("online γ", policy="online")],
        "exact vs judge acceptance": [row("exact"), row("judge δ=0.5", accept="judge")],
    }
    if chain_draft:
        chain = [row(f"{chain_draft} γ={g}", chain_draft), row(f"ngram→{chain_draft} chain", f"ngram,{chain_draft}")]
        tables["plain SD vs polybasic chain"] = chain
    return tables


def default_table(preset: str) -> pd.DataFrame:
    return pd.DataFrame(next(iter(comparison_presets(preset).values())), columns=CONFIG_COLUMNS)


def _cell(row: pd.Series, name: str, default):
    value = row.get(name, default)
    if value is None or (isinstance(value, float) and value != value) or (isinstance(value, str) and not value.strip()):
        return default
    return value


def parse_table(table, preset: str, sampling: dict) -> list[tuple[str, DecodeConfig]]:
    """(label, validated config) per non-empty row; errors name the row."""
    df = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table or [], columns=CONFIG_COLUMNS)
    df = df.rename(columns=dict(zip(df.columns, CONFIG_COLUMNS))) if len(df.columns) == len(CONFIG_COLUMNS) else df
    configs = []
    for i, row in df.iterrows():
        if all(_cell(row, c, None) is None for c in CONFIG_COLUMNS):
            continue
        draft = str(_cell(row, "draft", default_draft(preset)))
        chain = [n.strip() for n in re.split(r"[,→]", draft) if n.strip()] if re.search(r"[,→]", draft) else None
        try:
            config = make_config(preset=preset, method=_cell(row, "method", "sd"), draft=None if chain else draft, chain=chain,
                                 gamma=_cell(row, "γ", DecodeConfig.gamma), gamma_policy=_cell(row, "γ policy", "fixed"),
                                 accept=_cell(row, "accept", "exact"), judge_threshold=_cell(row, "δ", 0.5),
                                 lenience=_cell(row, "lenience", 1.0), topk=_cell(row, "top-k", 5), **sampling)
        except ConfigError as exc:
            raise ConfigError(f"configuration row {len(configs) + 1} ({_cell(row, 'label', i)}): {exc}") from None
        configs.append((str(_cell(row, "label", f"config {len(configs) + 1}")), config))
    if not configs:
        raise ConfigError("add at least one configuration to the table")
    if len(configs) > MAX_CONFIGS:
        raise ConfigError(f"compare at most {MAX_CONFIGS} configurations at once, got {len(configs)}")
    labels = [label for label, _ in configs]
    if len(set(labels)) != len(labels) or AR_LABEL in labels:
        raise ConfigError("give every configuration its own label")
    return configs


def frame(status=None, columns=None, race=None, metrics=None, replay=None, csv_file=None, json_file=None, session=None,
          column=None, traces=None) -> tuple:
    values = (status, columns, race, metrics, replay, csv_file, json_file, session, column, traces)
    return tuple(gr.skip() if v is None else v for v in values)


class Comparison:
    """The runs of one comparison: per label, every round's record; the first round is displayed."""

    def __init__(self, prompt: str, labels: list[str], configs: dict[str, DecodeConfig], n_rounds: int = 1):
        self.prompt, self.labels, self.configs, self.n_rounds = prompt, labels, configs, n_rounds
        self.rounds: dict[str, list[dict]] = {label: [] for label in labels}
        self.chunks: dict[str, list[list]] = {}
        """Per label (first round): [seconds since start, tokens so far, the step's span HTML] per step."""
        self.order: list[str] = []
        self.views: dict[str, dict] = {}
        """Per label (first round): the step panel's view, growing with the run, then its trace with the AR baseline."""

    def add_steps(self, label: str, builder: TraceBuilder, batch: list) -> None:
        chunks = self.chunks.setdefault(label, [])
        for event in batch:
            spans = builder.add(event)
            chunks.append([event.elapsed_ms / 1e3, builder.new_tokens, spans_html(spans)])

    def columns(self, at_s: float | None = None) -> str:
        return columns_at(self.labels, self.chunks, {label: self.describe(label) for label in self.labels}, at_s)

    def describe(self, label: str) -> str:
        c = self.configs[label]
        if c.method == "ar":
            return "autoregressive"
        return f"{c.draft}, γ={c.gamma}, {c.gamma_policy}, {c.accept}"

    def race(self):
        series = []
        for label in self.labels:
            chunks = self.chunks.get(label)
            if chunks:
                series.append(charts.Series(label, [0.0] + [c[0] for c in chunks], [0] + [c[1] for c in chunks],
                                            baseline=label == AR_LABEL))
        return charts.race_figure(series, "All configurations: tokens vs wall-clock time (first round)")

    def max_time(self) -> float:
        return max((chunks[-1][0] for chunks in self.chunks.values() if chunks), default=0.0)


def columns_at(labels: list[str], chunks: dict[str, list[list]], descriptions: dict[str, str], at_s: float | None = None) -> str:
    """One column per configuration; with ``at_s``, each shows only what its run had produced by then."""
    cols = []
    for label in labels:
        shown = [c for c in chunks.get(label, []) if at_s is None or c[0] <= at_s + 1e-9]
        if label not in chunks:
            sub = f"{descriptions[label]} · waiting"
        else:
            when = f" at {at_s:.2f} s" if at_s is not None else ""
            sub = f"{descriptions[label]} · {shown[-1][1] if shown else 0} tokens{when}"
        cols.append(column_html(label, sub, "".join(c[2] for c in shown)))
    return columns_html(cols)


def metrics_table(comp: Comparison) -> pd.DataFrame:
    """Medians over rounds; speedup is the median of per-round ratios to AR (same round)."""
    rows = []
    ar_rounds = comp.rounds.get(AR_LABEL, [])
    for label in comp.labels:
        recs = comp.rounds[label]
        if not recs:
            continue
        med = lambda key, recs=recs: statistics.median(r["metrics"][key] for r in recs)
        ratios = [r["metrics"]["tokens_per_s"] / a["metrics"]["tokens_per_s"] for r, a in zip(recs, ar_rounds)
                  if a["metrics"]["tokens_per_s"] > 0]
        drafted = any(r["metrics"]["drafted"] for r in recs)
        positions = [str(comp.order.index(f"{label}#{k + 1}") + 1) for k in range(len(recs)) if f"{label}#{k + 1}" in comp.order]
        same = all(r["token_ids"] == a["token_ids"] for r, a in zip(recs, ar_rounds)) if ar_rounds else None
        rows.append([label, ",".join(positions), int(med("new_tokens")), round(med("wall_s"), 3), round(med("tokens_per_s"), 2),
                     round(statistics.median(ratios), 3) if ratios else None, round(med("mean_accept_len"), 3),
                     round(med("accept_rate"), 3) if drafted else None, round(med("draft_ms"), 1), round(med("verify_ms"), 1),
                     round(med("overhead_ms"), 1), "–" if same is None else ("yes" if same else "no")])
    return pd.DataFrame(rows, columns=METRIC_COLUMNS)


def _run_one(models: Models, comp: Comparison, label: str, rnd: int, session: dict) -> Iterator[tuple]:
    """Stream one configuration; its first round updates its column live."""
    config = comp.configs[label]
    run = plan(config, comp.prompt, models.bank)
    builder = TraceBuilder(run.tokenizer, run.prompt_ids)
    raw, last_cols, last_chart = [], 0.0, 0.0
    if rnd == 0:
        view = comp.views[label] = {"steps": builder.events, "pieces": {}, "config": config.to_dict(), "baseline": None, "follow": True,
                                    "selector": f"#compare-columns .sv-col:nth-child({comp.labels.index(label) + 1})"}
        session["views"][view_key(label)] = view
    for steps in decode_steps(config.to_dict(), comp.prompt):
        batch = [StepEvent(**step) for step in steps]
        raw += batch
        if rnd == 0:
            comp.add_steps(label, builder, batch)
            view["pieces"].update(token_pieces(run.tokenizer, batch))
        else:
            builder.add_all(batch)
        now = time.perf_counter()
        if now - last_cols >= COLUMNS_EVERY_S:  # later rounds only report progress; the columns show round 1
            last_cols = now
            race = columns = None
            if rnd == 0:
                columns = comp.columns()
                if now - last_chart >= CHART_EVERY_S:
                    race, last_chart = comp.race(), now
            yield frame(status=_progress(comp, label, rnd, builder.new_tokens), columns=columns, race=race)
    record = run_record(label, config, builder.events, result_of(run, raw), round=rnd + 1, order=len(comp.order) + 1)
    if rnd == 0:
        comp.views[label] = {**trace_of(comp.prompt, run, raw).to_dict(), "follow": True, "selector": view["selector"]}
    comp.rounds[label].append(record)
    comp.order.append(f"{label}#{rnd + 1}")
    if label == AR_LABEL:
        put_baseline(session, baseline_key(config, comp.prompt), {**record, "measured": "in a comparison"})


def _progress(comp: Comparison, label: str, rnd: int, tokens: int) -> str:
    return status_html(f"Round {rnd + 1}: running '{label}' ({len(comp.order) + 1} of {len(comp.labels) * comp.n_rounds}): "
                       f"{tokens}/{comp.configs[label].max_new_tokens} tokens…", "busy")


def _warm_up(models: Models, comp: Comparison) -> None:
    """A few tokens through every configuration first, so no run pays a first-call cost."""
    for label in comp.labels:
        models.load_weights(comp.configs[label])
        for _ in decode_steps(replace(comp.configs[label], max_new_tokens=WARMUP_TOKENS).to_dict(), comp.prompt):
            pass


def compare_frames(models: Models, prompt: str, preset: str, table, sampling: dict, repeats: int, session: dict) -> Iterator[tuple]:
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty: type a prompt or pick an example")
    if not 1 <= repeats <= 5:
        raise ConfigError(f"rounds must be between 1 and 5, got {repeats}")
    configs = parse_table(table, preset, sampling)
    live = session["live"] = {"running": True, "kind": "compare", "done": 0}
    labels = [AR_LABEL] + [label for label, _ in configs]
    comp = Comparison(prompt, labels, {AR_LABEL: ar_config(configs[0][1]), **dict(configs)}, repeats)
    choices = [(label, view_key(label)) for label in labels]
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
    session["compare"] = {"prompt": prompt, "labels": labels, "order": comp.order, "chunks": comp.chunks,
                          "descriptions": {label: comp.describe(label) for label in labels}}
    csv_path, json_path = export(comp, sampling, preset)
    traces = save_column_traces(comp, session)
    order = " → ".join(comp.order)
    end = comp.max_time()
    yield frame(status=status_html(f"Done: {len(comp.order)} runs after a {WARMUP_TOKENS}-token warm-up each. Run order: {order}. "
                                   "Drag the time slider to replay every column in sync.", "ok"),
                columns=comp.columns(), race=comp.race(), metrics=metrics_table(comp),
                replay=gr.update(value=round(end, 2), maximum=max(0.01, round(end + 0.005, 2)), interactive=True),
                csv_file=str(csv_path), json_file=str(json_path), session=session, traces=traces)


def view_key(label: str) -> str:
    return f"compare: {label}"


def save_column_traces(comp: Comparison, session: dict) -> list[str]:
    """Each column's first run as a trace file (with the AR run as its baseline); the step panel shows them."""
    folder, paths = export_folder(), []
    ar = comp.views.get(AR_LABEL)
    for i, label in enumerate(comp.labels):
        view = comp.views.get(label)
        if view is None or "spans" not in view:
            continue
        view["baseline"] = {k: v for k, v in ar.items() if k not in ("follow", "selector")} if ar and label != AR_LABEL else None
        session["views"][view_key(label)] = view
        path = folder / f"specviz-compare-{i + 1}-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')[:40]}.json"
        Trace.from_dict({k: v for k, v in view.items() if k not in ("follow", "selector")}).save(path)
        paths.append(str(path))
    return paths


def export(comp: Comparison, sampling: dict, preset: str) -> tuple[Path, Path]:
    """Every step of every run as CSV, and the whole comparison as JSON, in a fresh temp folder."""
    folder = export_folder()
    fields = ["config", "round", "order", "method", "draft", "gamma_setting", "gamma_policy", "accept", "step", "drafter", "gamma",
              "drafted", "accepted", "emitted", "accept_reasons", "draft_ms", "verify_ms", "overhead_ms", "total_ms", "elapsed_ms"]
    csv_path, json_path = folder / "specviz-compare-steps.csv", folder / "specviz-compare.json"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for label in comp.labels:
            for rec in comp.rounds[label]:
                c = rec["config"]
                for e in rec["events"]:
                    draft = c["draft"] or ",".join(c["chain"])
                    w.writerow([label, rec["round"], rec["order"], c["method"], draft, c["gamma"], c["gamma_policy"], c["accept"],
                                e["step"], e["drafter"], e["gamma"], len(e["draft_ids"]), e["accepted"], len(e["emitted_ids"]),
                                " ".join(e["accept_reasons"]), round(e["draft_ms"], 3), round(e["verify_ms"], 3),
                                round(e["overhead_ms"], 3), round(e["total_ms"], 3), round(e["elapsed_ms"], 3)])
    summary = metrics_table(comp)
    payload = {"prompt": comp.prompt, "preset": preset, "sampling": sampling, "order": comp.order,
               "warmup_tokens": WARMUP_TOKENS, "summary": json.loads(summary.to_json(orient="records")),
               "runs": [rec for label in comp.labels for rec in comp.rounds[label]]}
    json_path.write_text(json.dumps(payload, indent=1, default=str))
    return csv_path, json_path


def compare_run(prompt: str, preset: str, configs: pd.DataFrame, temperature: float, top_p: float, seed: float,
                max_new_tokens: float, chat: bool, rounds: float, session: dict | None):
    """Run every configuration and AR on the same prompt and seed; stream columns, chart, metrics, exports."""
    session = ensure_session(session)
    sampling = {"temperature": temperature, "top_p": top_p, "seed": seed, "max_new_tokens": max_new_tokens, "chat": chat}

    def frames() -> Iterator[tuple]:
        n = int(rounds) if rounds is not None and float(rounds) == int(rounds) else -1
        yield from compare_frames(shared_models(), prompt, preset, configs, sampling, n, session)

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


def build_compare_tab(session: gr.State) -> None:
    """The Compare tab's layout and events (inside a Blocks context)."""
    rows, labels = example_prompts()
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(default_prompt(), lines=3, label="Prompt (shared by every configuration)", elem_id="compare-prompt")
            if rows:
                gr.Examples(rows, [prompt], label="Example prompts", example_labels=labels, examples_per_page=6)
        with gr.Column(scale=2):
            preset = preset_dropdown("compare")
            max_tokens = max_tokens_slider(48, "compare")
            with gr.Accordion("Sampling (shared: temperature, top-p, seed, chat template)", open=False):
                temperature, top_p, seed, chat = sampling_controls("compare")
            rounds = gr.Slider(1, 5, value=1, step=1, label="Rounds (order rotated each round; metrics are medians)")
    gr.Markdown("**Configurations** (2–4 rows; edit cells, add or delete rows). method: `sd` | `ar`; draft: a draft of the preset, "
                "`ngram`, a hub id, a local dir, or a polybasic chain fastest first (`ngram,draft-s`; the target verifies last); "
                "γ policy: `fixed` `fsm` `cache-fsm` `online` `rl` `hf-heuristic` `confidence`; accept: `exact` `judge` (δ) "
                "`lenient` (lenience) `topk` (top-k). The AR baseline always runs too.")
    with gr.Row():
        loader = gr.Dropdown(list(comparison_presets("smollm2-offline")), value=None, label="Load a ready-made comparison", scale=1)
    table = gr.Dataframe(default_table(preset.value), headers=CONFIG_COLUMNS, interactive=True,
                         label="Configurations", elem_id="compare-configs")
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
    wire_step_panel(panel, session, column)
    column.change(lambda key, session: view_update(ensure_session(session)["views"].get(key), None, "compare-columns"),
                  [column, session], panel.outputs(), api_visibility="private", queue=False)
    loader.change(lambda name, p: pd.DataFrame(comparison_presets(p).get(name) or comparison_presets(p)[next(iter(comparison_presets(p)))],
                                               columns=CONFIG_COLUMNS) if name else gr.skip(),
                  [loader, preset], table, api_visibility="private", queue=False)
    event = run_btn.click(compare_run, [prompt, preset, table, temperature, top_p, seed, max_tokens, chat, rounds, session],
                          [status, columns, race, metrics, replay, csv_file, json_file, session, column, traces],
                          api_name="compare_run", concurrency_id="decode", concurrency_limit=decode_concurrency(),
                          show_progress="hidden")
    stop_btn.click(None, None, None, cancels=[event])
    stop_btn.click(compare_stopped, session, status, api_visibility="private", queue=False)
    replay.release(compare_replay, [replay, session], columns, api_name="compare_replay")
