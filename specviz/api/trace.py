"""Trace files: a finished decode with everything its views need (:class:`Trace`), read back with the checks that keep
a damaged or foreign file from reaching the app, and the trace of a run's events (:func:`trace_of`)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from specviz.analysis.result import result_of
from specviz.core.errors import ConfigError
from specviz.core.metrics import summarize
from specviz.core.record import StepEvent, upgraded
from specviz.models.loading import describe_hardware
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import RunPlan
from specviz.runtime.serving import serving_export
from specviz.viz import charts
from specviz.viz.export import race_series, run_label, trace_headline, trace_page
from specviz.viz.render import Headline, TokenSpan, headline_html, legend_html, spans_html, token_css
from specviz.viz.trace import TraceBuilder

TRACE_FORMAT, TRACE_VERSION = "specviz-trace", 5  # 2: a step may hold a token tree ("tree"); 3: spans, why, drafted;
# 4: a run may come from a server ("source"), and a local one carries its export ("serving"); 5: a tree's nodes hold a
# verify entry's keys
MAX_TRACE_BYTES = 32 * 2**20


@dataclass
class Trace:
    """A finished decode: the continuation, every step, the run's metrics and theory, the token texts its views need
    (so a saved trace shows everything with no model loaded), and, when asked for, the autoregressive baseline of the
    same prompt and settings."""

    prompt: str
    config: DecodeConfig
    text: str
    token_ids: list[int]
    steps: list[StepEvent]
    metrics: dict
    theory: dict | None
    spans: list[TokenSpan] = field(repr=False, default_factory=list)
    pieces: dict[int, str] = field(repr=False, default_factory=dict)
    models: dict = field(default_factory=dict)
    machine: str = ""
    baseline: Trace | None = field(repr=False, default=None)
    transformers: dict | None = None
    """transformers' ``generate`` timed on the AR baseline's settings and prompt, when it was (see
    :func:`specviz.bench.harness.generate_figure`); traces written before it have none."""
    source: dict | None = None
    serving: dict | None = None

    JSON_KEYS: ClassVar[dict[str, str]] = {
        "text": "the decoded continuation (special tokens skipped)",
        "token_ids": "the emitted token ids",
        "config": "every `DecodeConfig` field, as run",
        "metrics": "the run's numbers (below)",
        "steps": "one object per step (below)",
        "theory": "the polybasic theory of the run (below); `null` when the drafter changed between steps (draft selection)",
        "machine": "the CPU or GPU, threads and torch; on a CPU, the target's linear kernel per row count, timed on the machine",
        "source": "`null` for a run of this process's engine; a server's run: its `url`, `engine` (`vllm`), `version`, "
                  "`model`, `speculative_config` (what the server reports of it), `speculative_decoding` (its totals), "
                  "`finish_reason` and `timing` (its per-request times, ms, and the request's time as the client saw it)",
        "serving": "the run's speculation for a serving engine (below); `null` for a server's run",
    }
    """The keys of :meth:`to_json`, the CLI's ``--json`` object (the docs render this table)."""

    @property
    def speedup(self) -> float | None:
        """Tokens/s against the baseline's, if there is one."""
        if self.baseline is None or not self.baseline.metrics["tokens_per_s"]:
            return None
        return self.metrics["tokens_per_s"] / self.baseline.metrics["tokens_per_s"]

    def to_json(self) -> dict:
        """The CLI's ``--json`` object."""
        return {"text": self.text, "token_ids": self.token_ids, "config": self.config.to_dict(), "metrics": self.metrics,
                "steps": [e.to_dict() for e in self.steps], "theory": self.theory, "machine": self.machine,
                "source": self.source, "serving": self.serving}

    def to_dict(self) -> dict:
        """The trace file's content: the ``--json`` object plus the prompt, the models, the machine, the token texts,
        the spans, the baseline and transformers' generate beside it, under a format name and version."""
        return {"format": TRACE_FORMAT, "version": TRACE_VERSION, "prompt": self.prompt, "models": self.models,
                **self.to_json(), "pieces": {str(k): v for k, v in self.pieces.items()},
                "spans": [astuple(s) for s in self.spans], "baseline": self.baseline.to_dict() if self.baseline else None,
                **({"transformers": self.transformers} if self.transformers is not None else {})}

    def save(self, path: str | Path) -> Path:
        """Write the trace as one JSON file (``load_trace`` reads it back)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False))
        return path

    def to_html(self, path: str | Path | None = None) -> str:
        """One self-contained HTML page (token view, headline, race chart, step-through, microscope, replay) that
        works offline from disk; written to ``path`` if given."""
        page = trace_page(self.to_dict())
        if path is not None:
            Path(path).write_text(page)
        return page

    def to_dataframe(self):
        """One row per step (pandas)."""
        import pandas as pd

        return pd.DataFrame([e.to_dict() for e in self.steps])

    def figure(self):
        """The race chart: tokens generated against wall-clock time, with the baseline when there is one."""
        return charts.race_figure(race_series(self.to_dict()))

    def headline(self) -> Headline:
        return trace_headline(self.to_dict())

    def _repr_html_(self) -> str:
        return (f"<style>{token_css()}</style><div class='specviz-trace'><b>{html.escape(run_label(self.config.to_dict()))}</b>"
                f"{headline_html(self.headline())}{legend_html()}<div class='sv-tokens'>{spans_html(self.spans)}</div></div>")

    @classmethod
    def from_dict(cls, data: Any) -> Trace:
        """A trace from a file's content; a malformed, foreign or too new one raises a one-line ConfigError."""
        data = check_trace(data)
        config = data["config"]
        if config.get("tree_nodes"):  # a tree run reads no γ, so a trace may hold any value there; validation wants the default
            config = {**config, "gamma": DecodeConfig.gamma}
        steps = [StepEvent.from_dict(step) for step in data["steps"]]
        metrics = {**summarize(steps), **data["metrics"]}  # an older trace's metrics lack the keys of later versions
        return cls(data["prompt"], DecodeConfig.from_values(config), data["text"], data["token_ids"], steps, metrics, data["theory"],
                   [TokenSpan(*s) for s in data["spans"]], {int(k): v for k, v in data["pieces"].items()}, data["models"],
                   data["machine"], cls.from_dict(data["baseline"]) if data["baseline"] else None, data.get("transformers"),
                   data.get("source"), data.get("serving"))


def load_trace(path: str | Path) -> Trace:
    """Read a trace file written by :meth:`Trace.save` (or by the CLI's ``--trace-out``, or the app)."""
    return Trace.from_dict(read_trace(path))


def read_trace(path: str | Path) -> dict:
    """A trace file's JSON content, or a one-line ConfigError saying why it is not one."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ConfigError(f"{path.name} is {path.stat().st_size / 2**20:.1f} MB: a trace file is at most {MAX_TRACE_BYTES // 2**20} MB")
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read trace file {path.name}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path.name} is not a specviz trace: not valid JSON ({str(exc).splitlines()[0][:80]})") from None




def check_trace(data: Any) -> dict:
    """``data`` if it is a trace this version reads; else a one-line ConfigError naming the first problem."""
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise ConfigError("not a specviz trace: the file has no \"format\": \"specviz-trace\" field")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise ConfigError(f"specviz trace with an invalid version {version!r}")
    if version > TRACE_VERSION:
        raise ConfigError(f"this trace is version {version}, newer than this specviz reads ({TRACE_VERSION}): upgrade specviz")
    expected = {"prompt": str, "config": dict, "text": str, "token_ids": list, "steps": list, "metrics": dict, "pieces": dict,
                "spans": list, "models": dict, "machine": str}
    for key, kind in expected.items():
        if not isinstance(data.get(key), kind):
            raise ConfigError(f"truncated or damaged trace: '{key}' is missing or not a {kind.__name__}")
    for i, step in enumerate(data["steps"]):
        required, allowed = StepEvent.json_keys()
        if not isinstance(step, dict) or not required <= set(upgraded(step)) or set(upgraded(step)) - allowed:
            raise ConfigError(f"truncated or damaged trace: step {i + 1} does not have a step's fields")
    if not all(isinstance(s, list | tuple) and len(s) == len(fields(TokenSpan)) for s in data["spans"]):
        raise ConfigError("truncated or damaged trace: a token span is not a list of its fields")
    for key in ("source", "serving"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ConfigError(f"truncated or damaged trace: '{key}' is not an object")
    if data.get("baseline") is not None:
        check_trace(data["baseline"])
    check_generate(data.get("transformers"))
    return data


def check_generate(figure: Any) -> None:
    """A trace's transformers figure, if it has one, is a failure's ``error`` or a measurement's numbers."""
    if figure is None:
        return
    if not isinstance(figure, dict):
        raise ConfigError("truncated or damaged trace: 'transformers' is not an object")
    if isinstance(figure.get("error"), str):
        return
    numbers = [figure.get(key) for key in ("tokens_per_s", "wall_s", "new_tokens")]
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and x >= 0 for x in numbers) or not numbers[0]:
        raise ConfigError("truncated or damaged trace: 'transformers' has no tokens/s, wall time and new tokens")


def trace_of(prompt: str, plan: RunPlan, events: Sequence[StepEvent], machine: str | None = None) -> Trace:
    """The Trace of a run's events (``plan``: a prepared run's ``plan``, or ``runtime.prepare.plan``'s; ``machine``: the
    prepared run's, else this process's hardware)."""
    result = result_of(plan, list(events))
    spans = TraceBuilder(plan.tokenizer, plan.prompt_ids).add_all(events)
    models = {"target": plan.target, "drafters": sorted({e.drafter for e in events if e.draft_ids})}
    return Trace(prompt, plan.config, result["text"], result["token_ids"], list(events), result["metrics"], result["theory"], spans,
                 token_pieces(plan.tokenizer, events), models, machine or describe_hardware(), serving=serving_export(plan.config))


def token_pieces(tokenizer: Any, events: Sequence[StepEvent]) -> dict[int, str]:
    """The text of every token id a step mentions (drafted, emitted, or among the recorded alternatives)."""
    ids = set()
    for e in events:
        ids.update(e.draft_ids, e.emitted_ids)
        for v in e.nodes:
            ids.update(t for t, _ in v.p_top + v.q_top + (v.residual_top or {}).get("top", []))
    ids = sorted(ids - {None})  # a server's rejected drafts have no id
    return dict(zip(ids, tokenizer.batch_decode([[i] for i in ids])))
