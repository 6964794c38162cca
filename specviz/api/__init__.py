"""The Python API: ``speculate`` runs one decode and returns a :class:`Trace`; ``stream`` yields its steps as they
happen. Both take what the CLI takes: a preset, draft names, hub ids or local directories, and also models that
are already loaded. Settings are :class:`~specviz.runtime.config.DecodeConfig`'s names; mistakes raise the
one-line :class:`~specviz.core.errors.ConfigError` (naming settings as keyword arguments, ``gamma=``) or
:class:`~specviz.core.errors.ModelLoadError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specviz.api.server import server_trace
from specviz.api.trace import Trace, load_trace, trace_of
from specviz.bench.harness import GENERATE_WARMUP_TOKENS, generate_figure, time_generate
from specviz.core.errors import ConfigError
from specviz.core.record import StepEvent
from specviz.models.loaded import LoadedModel
from specviz.models.presets import NGRAM_DRAFT, PRESETS, resolve_draft, resolve_preset
from specviz.models.vllm_client import DEFAULT_TIMEOUT_S
from specviz.runtime.bank import ModelBank, target_dtype
from specviz.runtime.config import DecodeConfig, respelled
from specviz.runtime.prepare import baseline_config, prepare

__all__ = ["Trace", "keyword", "load_trace", "speculate", "stream"]

_bank: ModelBank | None = None


def bank() -> ModelBank:
    """The process's model bank: models named by preset, hub id or directory are loaded once and reused."""
    global _bank
    _bank = _bank or ModelBank()
    return _bank


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
              transformers: bool = False, server: str | None = None, model: str | None = None,
              server_timeout: float = DEFAULT_TIMEOUT_S, speculative_config: dict | None = None, **settings: Any) -> Trace:
    """Decode ``prompt`` and return its :class:`Trace`.

    ``target``: a preset name, hub id, local directory or loaded transformers model (then pass its ``tokenizer``);
    None is the preset's target. ``draft``: a draft name of the preset, ``"ngram"``, a feature-head directory, a hub
    id, a local directory, a loaded model, or a list of them (the engine picks one per step). ``baseline``: also
    decode autoregressively on the same target with the same sampling settings, for the speedup (any method).
    ``transformers``: with ``baseline``, also time transformers' own ``generate`` on the baseline's settings, on its
    stock kernels, into ``trace.transformers`` (the headline's speedup over it). ``settings``: DecodeConfig's names
    (gamma, gamma_policy, accept, judge_threshold, chain, select, temperature, top_p, seed, max_new_tokens, chat=True,
    method…).

    ``server``: run on the vLLM server at this URL instead (its only model, or ``model``; the server's speculation,
    this call's sampling settings, each answer awaited at most ``server_timeout`` seconds; ``speculative_config``:
    the server's, where known); its failures raise a one-line :class:`~specviz.core.errors.ServerError`."""
    if server is not None:
        if target is not None or draft is not None or tokenizer is not None or baseline or transformers:
            raise ConfigError("server= runs the server's speculation: target=, draft=, tokenizer=, baseline= and transformers= "
                              "are for local runs")
        with _api_names():
            return server_trace(prompt, server, model, DecodeConfig.from_values(settings), server_timeout, speculative_config)
    if model is not None or speculative_config is not None:
        raise ConfigError("model= and speculative_config= describe a server: use them with server=")
    if transformers and not baseline:
        raise ConfigError("transformers=True times transformers' generate beside the AR baseline: pass baseline=True too")
    with _api_names():
        config, models = _inputs(target, draft, tokenizer, settings)
        run = prepare(config, prompt, bank(), **models)
    trace = trace_of(prompt, run.plan, list(run.events()), run.machine)
    if baseline:
        with _api_names():
            ar = prepare(baseline_config(config), prompt, bank(), target=models["target"], tokenizer=models["tokenizer"])
        trace.baseline = trace_of(prompt, ar.plan, list(ar.events()), ar.machine)
        if transformers:
            timing = time_generate(ar.config, prompt, bank(), GENERATE_WARMUP_TOKENS, target=models["target"],
                                   tokenizer=models["tokenizer"])
            trace.transformers = generate_figure(timing, trace.baseline.token_ids, ar.config.temperature > 0)
    return trace
