"""The Python API: ``speculate`` runs one decode and returns a :class:`Trace`; ``stream`` yields its steps as they
happen. Both take what the CLI takes: a preset, draft names, hub ids or local directories, and also models that
are already loaded. Settings are :class:`~specviz.runtime.config.DecodeConfig`'s names; mistakes raise the
one-line :class:`~specviz.core.errors.ConfigError` (naming settings as keyword arguments, ``gamma=``) or
:class:`~specviz.core.errors.ModelLoadError`."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from specviz.analysis.result import result_of
from specviz.core.cache import LoadedModel
from specviz.core.errors import ConfigError
from specviz.core.record import StepEvent
from specviz.models.loading import describe_hardware
from specviz.models.presets import NGRAM_DRAFT, PRESETS, resolve_draft, resolve_preset
from specviz.runtime.bank import ModelBank, target_dtype
from specviz.runtime.config import DecodeConfig, respelled
from specviz.runtime.prepare import RunPlan, baseline_config, prepare
from specviz.viz import charts
from specviz.viz.export import race_series, run_label, trace_headline, trace_page
from specviz.viz.render import Headline, TokenSpan, headline_html, legend_html, spans_html, token_css
from specviz.viz.trace import TraceBuilder

_bank: ModelBank | None = None


def bank() -> ModelBank:
    """The process's model bank: models named by preset, hub id or directory are loaded once and reused."""
    global _bank
    _bank = _bank or ModelBank()
    return _bank


TRACE_FORMAT, TRACE_VERSION = "specviz-trace", 2  # 2: a step may hold a token tree ("tree")
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

    JSON_KEYS: ClassVar[dict[str, str]] = {
        "text": "the decoded continuation (special tokens skipped)",
        "token_ids": "the emitted token ids",
        "config": "every `DecodeConfig` field, as run",
        "metrics": "the run's numbers (below)",
        "steps": "one object per step (below)",
        "theory": "the polybasic theory of the run (below); `null` when the drafter changed between steps (draft selection)",
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
                "steps": [e.to_dict() for e in self.steps], "theory": self.theory}

    def to_dict(self) -> dict:
        """The trace file's content: the ``--json`` object plus the prompt, the models, the machine, the token texts,
        the spans and the baseline, under a format name and version."""
        return {"format": TRACE_FORMAT, "version": TRACE_VERSION, "prompt": self.prompt, "models": self.models,
                "machine": self.machine, **self.to_json(), "pieces": {str(k): v for k, v in self.pieces.items()},
                "spans": [astuple(s) for s in self.spans], "baseline": self.baseline.to_dict() if self.baseline else None}

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
        return cls(data["prompt"], DecodeConfig.from_values(config), data["text"], data["token_ids"],
                   [StepEvent.from_dict(step) for step in data["steps"]], data["metrics"], data["theory"],
                   [TokenSpan(*s) for s in data["spans"]], {int(k): v for k, v in data["pieces"].items()}, data["models"],
                   data["machine"], cls.from_dict(data["baseline"]) if data["baseline"] else None)


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
        if not isinstance(step, dict) or not required <= set(step) or set(step) - allowed:
            raise ConfigError(f"truncated or damaged trace: step {i + 1} does not have a step's fields")
    if not all(isinstance(s, list | tuple) and len(s) == len(fields(TokenSpan)) for s in data["spans"]):
        raise ConfigError("truncated or damaged trace: a token span is not a list of its fields")
    if data.get("baseline") is not None:
        check_trace(data["baseline"])
    return data


def _loaded(model: Any, fallback: str) -> LoadedModel:
    """A transformers model object as a LoadedModel (used as it is: not moved, cast or repacked)."""
    config = model.config
    name = Path(getattr(config, "name_or_path", "") or fallback).name or fallback
    return LoadedModel(name, model.eval(), int(config.vocab_size))


def _is_model(value: Any) -> bool:
    return hasattr(value, "config") and hasattr(value, "forward")


def keyword(name: str) -> str:
    """A setting as this API's errors name it: its keyword argument (``select=``)."""
    return f"{name}="


@contextmanager
def _api_names() -> Iterator[None]:
    """ConfigErrors raised inside name settings as this API's keyword arguments, not as CLI options."""
    try:
        yield
    except ConfigError as exc:
        raise respelled(exc, keyword) from None


def _inputs(target: Any, draft: Any, tokenizer: Any, settings: dict) -> tuple[DecodeConfig, dict]:
    """The run's config and ``prepare``'s model arguments: names resolve through the preset, objects pass along."""
    settings = dict(settings)
    if isinstance(target, str) and target in PRESETS:
        settings["preset"], target = target, None
    items = [] if draft is None else list(draft) if isinstance(draft, list | tuple) else [draft]
    names = [_draft_name(d, i) for i, d in enumerate(items)]
    if isinstance(draft, list | tuple):
        settings["select"] = names
    elif names:
        settings["draft"] = names[0]
    config = DecodeConfig.from_values(settings)
    if items and (config.chain or config.method == "ar"):
        raise ConfigError("draft= is for speculative decoding without a chain: name a chain's models in chain=[...]")
    preset = resolve_preset(config.preset)
    drafts = [(name, _loaded(d, name) if _is_model(d) else resolve_draft(preset, name)) for name, d in zip(names, items)] or None
    if target is not None:
        target, tokenizer = _target(target, tokenizer, config)
        if drafts is None and config.method == "sd" and not (config.chain or config.select):
            drafts = [(NGRAM_DRAFT, NGRAM_DRAFT)]  # the preset's drafts belong to the preset's target
    return config, {"target": target, "tokenizer": tokenizer, "drafts": drafts}


def _draft_name(draft: Any, index: int) -> str:
    if _is_model(draft):
        return _loaded(draft, f"draft-{index}").name
    if not isinstance(draft, str | Path):
        raise ConfigError(f"draft must be a name, a hub id, a directory or a loaded model, got {type(draft).__name__}")
    return str(draft)


def _target(target: Any, tokenizer: Any, config: DecodeConfig) -> tuple[LoadedModel, Any]:
    if _is_model(target):
        if tokenizer is None:
            raise ConfigError("a loaded target model needs its tokenizer: speculate(..., target=model, tokenizer=tokenizer)")
        return _loaded(target, "target"), tokenizer
    if not isinstance(target, str | Path):
        raise ConfigError(f"target must be a preset, a hub id, a directory or a loaded model, got {type(target).__name__}")
    source = str(target)
    return bank().model(source, Path(source).name, target_dtype(config.dtype)), tokenizer or bank().tokenizer(source)


def stream(prompt: str, *, target: Any = None, draft: Any = None, tokenizer: Any = None, **settings: Any) -> Iterator[StepEvent]:
    """Decode ``prompt`` and yield one :class:`~specviz.core.record.StepEvent` per step (see :func:`speculate`)."""
    with _api_names():
        config, models = _inputs(target, draft, tokenizer, settings)
        return prepare(config, prompt, bank(), **models).events()


def speculate(prompt: str, *, target: Any = None, draft: Any = None, tokenizer: Any = None, baseline: bool = False,
              **settings: Any) -> Trace:
    """Decode ``prompt`` and return its :class:`Trace`.

    ``target``: a preset name, hub id, local directory or loaded transformers model (then pass its ``tokenizer``);
    None is the preset's target. ``draft``: a draft name of the preset, ``"ngram"``, a feature-head directory, a hub
    id, a local directory, a loaded model, or a list of them (the engine picks one per step). ``baseline``: also
    decode autoregressively on the same target with the same sampling settings, for the speedup (any method).
    ``settings``: DecodeConfig's names (gamma, gamma_policy, accept, judge_threshold, chain, select, temperature,
    top_p, seed, max_new_tokens, chat=True, method…)."""
    with _api_names():
        config, models = _inputs(target, draft, tokenizer, settings)
        run = prepare(config, prompt, bank(), **models)
    trace = trace_of(prompt, run.plan, list(run.events()))
    if baseline:
        with _api_names():
            ar = prepare(baseline_config(config), prompt, bank(), target=models["target"], tokenizer=models["tokenizer"])
        trace.baseline = trace_of(prompt, ar.plan, list(ar.events()))
    return trace


def trace_of(prompt: str, plan: RunPlan, events: Sequence[StepEvent]) -> Trace:
    """The Trace of a run's events (``plan``: a prepared run's ``plan``, or ``runtime.prepare.plan``'s)."""
    result = result_of(plan, list(events))
    spans = TraceBuilder(plan.tokenizer, plan.prompt_ids).add_all(events)
    models = {"target": plan.target, "drafters": sorted({e.drafter for e in events if e.draft_ids})}
    return Trace(prompt, plan.config, result["text"], result["token_ids"], list(events), result["metrics"], result["theory"], spans,
                 token_pieces(plan.tokenizer, events), models, describe_hardware())


def token_pieces(tokenizer: Any, events: Sequence[StepEvent]) -> dict[int, str]:
    """The text of every token id a step mentions (drafted, emitted, or among the recorded alternatives)."""
    ids = set()
    for e in events:
        ids.update(e.draft_ids, e.emitted_ids)
        for v in e.verify:
            ids.update(t for t, _ in v.p_top + v.q_top + (v.residual_top or {}).get("top", []))
    ids = sorted(ids)
    return dict(zip(ids, tokenizer.batch_decode([[i] for i in ids])))
