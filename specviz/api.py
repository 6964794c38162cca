"""The Python API: ``speculate`` runs one decode and returns a :class:`Trace`; ``stream`` yields its steps as they
happen. Both take what the CLI takes: a preset, draft names, hub ids or local directories, and also models that
are already loaded. Settings are :class:`~specviz.runtime.config.DecodeConfig`'s names; mistakes raise the
one-line :class:`~specviz.core.errors.ConfigError` or :class:`~specviz.core.errors.ModelLoadError`."""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specviz.analysis.result import run_to_result
from specviz.core.cache import LoadedModel
from specviz.core.engine import StepEvent
from specviz.core.errors import ConfigError
from specviz.models.presets import NGRAM_DRAFT, PRESETS, resolve_draft, resolve_preset
from specviz.runtime.bank import ModelBank, target_dtype
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import PreparedRun, prepare
from specviz.viz import charts
from specviz.viz.render import Headline, TokenSpan, headline_html, legend_html, spans_html, token_css
from specviz.viz.trace import TraceBuilder, cumulative

_bank: ModelBank | None = None


def bank() -> ModelBank:
    """The process's model bank: models named by preset, hub id or directory are loaded once and reused."""
    global _bank
    _bank = _bank or ModelBank()
    return _bank


@dataclass
class Trace:
    """A finished decode: the continuation, every step, the run's metrics and theory, and, when asked for, the
    autoregressive baseline of the same prompt and settings."""

    prompt: str
    config: DecodeConfig
    text: str
    token_ids: list[int]
    steps: list[StepEvent]
    metrics: dict
    theory: dict | None
    spans: list[TokenSpan] = field(repr=False, default_factory=list)
    baseline: Trace | None = field(repr=False, default=None)

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

    def to_dataframe(self):
        """One row per step (pandas)."""
        import pandas as pd

        return pd.DataFrame([e.to_dict() for e in self.steps])

    def figure(self):
        """The race chart: tokens generated against wall-clock time, with the baseline when there is one."""
        series = [charts.Series(_label(self.config), *cumulative(self.steps))]
        if self.baseline is not None:
            series.append(charts.Series("autoregressive", *cumulative(self.baseline.steps), baseline=True))
        return charts.race_figure(series)

    def headline(self) -> Headline:
        m, base = self.metrics, self.baseline.metrics if self.baseline else None
        return Headline(self.speedup, m["tokens_per_s"], base["tokens_per_s"] if base else None, m["mean_accept_len"],
                        m["accept_rate"] if m["drafted"] else None, m["new_tokens"], m["wall_s"],
                        "" if base else "no baseline: speculate(..., baseline=True) measures one")

    def _repr_html_(self) -> str:
        return (f"<style>{token_css()}</style><div class='specviz-trace'><b>{html.escape(_label(self.config))}</b>"
                f"{headline_html(self.headline())}{legend_html()}<div class='sv-tokens'>{spans_html(self.spans)}</div></div>")


def _label(config: DecodeConfig) -> str:
    if config.method == "ar":
        return "autoregressive"
    drafts = " → ".join(config.chain) if config.chain else ", ".join(config.select) or config.draft or "default draft"
    return f"sd {drafts} γ={config.gamma} ({config.gamma_policy}, {config.accept})"


def _loaded(model: Any, fallback: str) -> LoadedModel:
    """A transformers model object as a LoadedModel (used as it is: not moved, cast or repacked)."""
    config = model.config
    name = Path(getattr(config, "name_or_path", "") or fallback).name or fallback
    return LoadedModel(name, model.eval(), int(config.vocab_size))


def _is_model(value: Any) -> bool:
    return hasattr(value, "config") and hasattr(value, "forward")


def _prepared(prompt: str, target: Any, draft: Any, tokenizer: Any, settings: dict) -> PreparedRun:
    """Settings and models as ``prepare`` takes them: names resolve through the preset, objects pass along."""
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
    return prepare(config, prompt, bank(), target=target, tokenizer=tokenizer, drafts=drafts)


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
    """Decode ``prompt`` and yield one :class:`~specviz.core.engine.StepEvent` per step (see :func:`speculate`)."""
    return _prepared(prompt, target, draft, tokenizer, settings).events()


def speculate(prompt: str, *, target: Any = None, draft: Any = None, tokenizer: Any = None, baseline: bool = False,
              **settings: Any) -> Trace:
    """Decode ``prompt`` and return its :class:`Trace`.

    ``target``: a preset name, hub id, local directory or loaded transformers model (then pass its ``tokenizer``);
    None is the preset's target. ``draft``: a draft name of the preset, ``"ngram"``, a feature-head directory, a hub
    id, a local directory, a loaded model, or a list of them (the engine picks one per step). ``baseline``: also
    decode autoregressively with the same settings, for the speedup. ``settings``: DecodeConfig's names (gamma,
    gamma_policy, accept, judge_threshold, chain, temperature, top_p, seed, max_new_tokens, chat=True, method…)."""
    run = _prepared(prompt, target, draft, tokenizer, settings)
    trace = _trace(prompt, run, list(run.events()))
    if baseline:
        ar = {**settings, "method": "ar"}
        ar.pop("chain", None)
        trace.baseline = speculate(prompt, target=target, tokenizer=tokenizer, **ar)
    return trace


def _trace(prompt: str, run: PreparedRun, events: Sequence[StepEvent]) -> Trace:
    result = run_to_result(run, list(events))
    spans = TraceBuilder(run.tokenizer, run.prompt_ids).add_all(events)
    return Trace(prompt, run.config, result["text"], result["token_ids"], list(events), result["metrics"], result["theory"], spans)
