"""A run as the app shows it, with no gradio: the steps streamed so far and what the views draw from them, its
record and trace files, the session's cache of AR baselines, and the pace of live redraws. Explore and Compare
both build on it."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from specviz.api.trace import Trace, token_pieces
from specviz.core.metrics import summarize
from specviz.core.record import StepEvent
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import RunPlan, baseline_config
from specviz.ui.decode import decode_steps
from specviz.ui.exports import export_folder
from specviz.viz import charts
from specviz.viz.export import generate_series, run_label, trace_headline, trace_page
from specviz.viz.render import headline_html, spans_html
from specviz.viz.trace import TraceBuilder, cumulative

AR_LABEL = "autoregressive (AR baseline)"
BASELINE_CACHE_SIZE = 8
REDRAW_EVERY_S = 0.5
"""How often a streaming run redraws its tokens, status and headline: the browser's drawing shares the decode's cores."""
CHARTS_EVERY_S = 5.0
"""How often it redraws a live plotly chart, the costliest output to build and to draw."""


class Every:
    """Whether ``seconds`` have passed since it last said so (or since it was made, when not ``at_once``; else it
    says so the first time): a redraw's pace."""

    def __init__(self, seconds: float, at_once: bool = True):
        self.seconds, self.last = seconds, -math.inf if at_once else time.perf_counter()

    def due(self) -> bool:
        now = time.perf_counter()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


class Live:
    """One run's steps as they stream in, and what its views show: token spans per step (with the time they were
    made, for synchronised replays), the step panel's view, metrics and the race series."""

    def __init__(self, plan: RunPlan, label: str | None = None):
        self.plan = plan
        self.label = label or run_label(plan.config.to_dict())
        self.builder = TraceBuilder(plan.tokenizer, plan.prompt_ids)
        self.events: list[StepEvent] = []
        self.chunks: list[list] = []
        """Per step: [seconds since start, tokens so far, the step's span HTML]."""
        self.view = {"steps": self.builder.events, "pieces": {}, "config": plan.config.to_dict(), "baseline": None, "follow": True}

    def add(self, events: list[StepEvent]) -> None:
        self.events += events
        for event in events:
            spans = self.builder.add(event)
            self.chunks.append([event.elapsed_ms / 1e3, self.builder.new_tokens, spans_html(spans)])
        self.view["pieces"].update(token_pieces(self.plan.tokenizer, events))

    def stream(self, prompt: str) -> Iterator[list[StepEvent]]:
        """The run's steps from the decode (the GPU worker on ZeroGPU), batch by batch, recorded here as they come."""
        for batch in decode_steps(self.plan.config, prompt):
            self.add(batch)
            yield batch

    @property
    def tokens_html(self) -> str:
        return "".join(chunk[2] for chunk in self.chunks)

    @property
    def new_tokens(self) -> int:
        return self.builder.new_tokens

    def metrics(self) -> dict:
        return summarize(self.events)

    def series(self, baseline: bool = False, note: str = "") -> charts.Series:
        times, tokens = cumulative(self.builder.events)
        return charts.Series(self.label, times, tokens, baseline=baseline, note=note)


def headline(metrics: dict, config: DecodeConfig, ar: dict | None, note: str, transformers: dict | None = None) -> str:
    """The headline cards of a run: its speedup over the AR baseline ``ar`` (a run record) when there is one, and over
    transformers' generate when ``transformers`` (see :class:`~specviz.viz.render.Headline`) is given; as a trace of
    the run shows it (:func:`~specviz.viz.export.trace_headline`)."""
    shown = trace_headline({"config": config.to_dict(), "metrics": metrics, "baseline": ar and {"metrics": ar["metrics"]},
                            "transformers": transformers})
    return headline_html(shown if config.method == "ar" else replace(shown, baseline_note=note))


def run_race(live: Live, ar: dict | None, ar_note: str, transformers: dict | None = None):
    """The race chart: the run against its AR baseline ``ar`` (a run record) when there is one, and transformers'
    generate when it was timed."""
    series = [live.series()]
    if ar:
        series.append(charts.Series(AR_LABEL, *cumulative(ar["events"]), baseline=True, note=ar_note))
    return charts.race_figure(series + generate_series(transformers))


def run_dynamics(live: Live, ar: dict | None):
    """The per-step charts: throughput, γ, acceptance by position, time split."""
    return charts.dynamics_figure(charts.dynamics_from_events(live.builder.events, live.metrics(), ar["metrics"] if ar else None))


def run_record(label: str, config: DecodeConfig, events: Sequence[dict], result: dict, **extra: Any) -> dict:
    """A finished run as plain data: config, metrics, text, token ids, per-step events, theory."""
    return {"label": label, "config": config.to_dict(), "events": list(events), "metrics": result["metrics"],
            "text": result["text"], "token_ids": result["token_ids"], "theory": result.get("theory"),
            "finished_at": time.strftime("%H:%M:%S"), **extra}


def baseline_key(config: DecodeConfig, prompt: str) -> str:
    """What the AR baseline of a run depends on: the prompt and the baseline's own settings."""
    return json.dumps({"prompt": prompt, **baseline_config(config).to_dict()}, sort_keys=True)


def get_baseline(session: dict, config: DecodeConfig, prompt: str) -> dict | None:
    return session["baselines"].get(baseline_key(config, prompt))


def put_baseline(session: dict, config: DecodeConfig, prompt: str, record: dict) -> None:
    """Remember the AR run of ``config``'s baseline for ``prompt``; keeps the newest few."""
    baselines, key = session["baselines"], baseline_key(config, prompt)
    baselines.pop(key, None)
    baselines[key] = record
    while len(baselines) > BASELINE_CACHE_SIZE:
        baselines.pop(next(iter(baselines)))


def save_trace_files(trace: dict) -> tuple[str, str]:
    """The run as a trace file and as a self-contained HTML page, for the browser to download."""
    folder = export_folder()
    name = re.sub(r"[^a-z0-9]+", "-", run_label(trace["config"]).lower()).strip("-")[:60] or "run"
    json_path, html_path = folder / f"specviz-{name}.json", folder / f"specviz-{name}.html"
    Trace.from_dict(trace).save(json_path)
    html_path.write_text(trace_page(trace))
    return str(json_path), str(html_path)
