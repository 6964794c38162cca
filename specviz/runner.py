"""From a :class:`DecodeConfig` and a prompt to a running decode: models loaded once per process,
strategies built by name, and the JSON result of a finished run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .acceptance import ExactRule, JudgeRule, LenientRule, TopKRule
from .cache import CachedModel
from .chain import build_chain
from .config import ConfigError, DecodeConfig
from .drafters import Drafter, ModelDrafter, NGramDrafter
from .engine import StepEvent, decode
from .feature_head import FeatureDrafter, FeatureHead, is_feature_head, load_head
from .lean import cached_model
from .metrics import summarize
from .models import (
    NGRAM_DRAFT,
    LoadedModel,
    Preset,
    check_shared_vocab,
    load_model,
    load_tokenizer,
    pick_device,
    resolve_draft,
    resolve_preset,
    shared_vocab_size,
)
from .policies import FirstDraft, OnlineSelector, PerDrafterPolicy, make_policy
from .predictor import AcceptancePredictor
from .sampling import Sampler
from .theory import run_theory


def target_dtype(setting: str) -> torch.dtype:
    """The target's dtype. ``auto`` is bfloat16 on CUDA and float32 on CPU: a multi-token bf16 verify forward
    rounds differently from the single-token forwards of plain decoding, so near-ties flip and greedy speculative
    decoding stops matching ``generate`` token for token (6 of 12 suite prompts on an AVX-512-bf16 CPU)."""
    if setting == "auto":
        return torch.bfloat16 if pick_device().type == "cuda" else torch.float32
    return getattr(torch, setting)


class ModelBank:
    """Loads every model and tokenizer once per process and shares them between runs (and sessions:
    runs never share caches, only read-only weights)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()

    def _get(self, kind: str, key: object, load):
        with self._lock:
            if (kind, key) not in self._items:
                self._items[(kind, key)] = load()
            return self._items[(kind, key)]

    def model(self, source: str, name: str, dtype: torch.dtype | None = None) -> LoadedModel:
        """A draft (``dtype`` None: the fastest measured on CPU) or any model in a given dtype."""
        return self._get("model", (source, dtype), lambda: load_model(source, name, dtype=dtype))

    def target(self, preset: Preset, dtype: str = "auto") -> LoadedModel:
        return self.model(preset.target, preset.target.rsplit("/", 1)[-1], target_dtype(dtype))

    def head(self, source: str, target: LoadedModel) -> tuple[FeatureHead, list[int] | None]:
        """A feature head on ``target``'s device and dtype, with its draft vocabulary."""
        return self._get("head", (source, target.dtype), lambda: load_head(Path(source), target.model))

    def tokenizer(self, source: str):
        return self._get("tokenizer", source, lambda: load_tokenizer(source))

    def loaded_models(self) -> list[LoadedModel]:
        with self._lock:
            return [m for (kind, _), m in self._items.items() if kind == "model"]


@dataclass
class PreparedRun:
    """Everything a decode needs, built and checked; ``events()`` starts it."""

    config: DecodeConfig
    tokenizer: object
    prompt_ids: list[int]
    target: CachedModel
    drafters: list[Drafter]
    sampler: Sampler
    stop_ids: list[int]
    rule: ExactRule

    def events(self) -> Iterator[StepEvent]:
        selector, policy = FirstDraft(), make_policy(self.config.gamma_policy, self.config.gamma)
        if len(self.drafters) > 1:
            predictor = AcceptancePredictor.load()
            selector = OnlineSelector(priors=predictor.priors(self.drafters, self.prompt_ids) if predictor else None)
            policy = PerDrafterPolicy(lambda: make_policy(self.config.gamma_policy, self.config.gamma))
        return decode(self.target, self.prompt_ids, drafters=self.drafters, rule=self.rule,
                      policy=policy, selector=selector, sampler=self.sampler,
                      max_new_tokens=self.config.max_new_tokens, stop_ids=self.stop_ids)


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(prompt).input_ids


def stop_ids_of(lm: LoadedModel, tokenizer) -> list[int]:
    eos = lm.model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def prepare(config: DecodeConfig, prompt: str, bank: ModelBank) -> PreparedRun:
    """Validate, load (or reuse) the models, encode the prompt; raises ConfigError / ModelLoadError."""
    config.validate()
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")
    preset = resolve_preset(config.preset)
    default_draft = config.draft or next(iter(preset.drafts), NGRAM_DRAFT)
    draft_names = (config.chain or config.select or [default_draft]) if config.method == "sd" else []
    draft_sources = [(name, resolve_draft(preset, name)) for name in draft_names]
    tokenizer = bank.tokenizer(preset.target)
    target = bank.target(preset, config.dtype)
    prompt_ids = encode_prompt(tokenizer, prompt, config.chat)
    room = target.max_positions - len(prompt_ids)
    if room < config.max_new_tokens:
        raise ConfigError(f"the prompt is {len(prompt_ids)} tokens; with --max-new-tokens {config.max_new_tokens} it exceeds "
                          f"the target's context of {target.max_positions} tokens")
    heads = {name: bank.head(src, target) for name, src in draft_sources if src != NGRAM_DRAFT and is_feature_head(Path(src))}
    if heads and config.chain:
        raise ConfigError(f"--chain: '{next(iter(heads))}' is a feature head; it drafts from the target's own states, "
                          "so it cannot be a level of a chain")
    draft_models = {name: bank.model(src, name) for name, src in draft_sources if src != NGRAM_DRAFT and name not in heads}
    for name, src in draft_sources:
        if name in draft_models and not (Path(src) / "specviz.json").exists():
            check_shared_vocab(tokenizer, bank.tokenizer(src), name)
    vocab = shared_vocab_size(target, *draft_models.values())
    target_model = cached_model(target, vocab)
    drafters = [make_drafter(name, draft_models, heads, target_model, config.full_draft_vocab) for name, _ in draft_sources]
    if config.chain:
        drafters = [build_chain(drafters[0], [d.model for d in drafters[1:]], config.level_gamma)]
    sampler = Sampler(config.temperature, config.top_p, config.seed, target.device)
    return PreparedRun(config, tokenizer, prompt_ids, target_model, drafters, sampler, stop_ids_of(target, tokenizer),
                       make_rule(config, target))


def make_drafter(name: str, draft_models: dict[str, LoadedModel], heads: dict[str, tuple], target: CachedModel,
                 full_vocab: bool) -> Drafter:
    """The drafter called ``name``: a draft model, a feature head on ``target``, or the n-gram lookup."""
    if name in heads:
        head, draft_vocab = heads[name]
        return FeatureDrafter(head, target, None if full_vocab else draft_vocab, name)
    if name in draft_models:
        return ModelDrafter(cached_model(draft_models[name], target.vocab_size, full_vocab, int8=True))
    return NGramDrafter()


def make_rule(config: DecodeConfig, target: LoadedModel) -> ExactRule:
    """The acceptance rule by name; the judge head is the one trained for this target."""
    if config.accept == "judge":
        from .judge import JudgeHead, default_head_path

        head = JudgeHead.load(default_head_path(target.name), target.name, target.model.config.hidden_size)
        return JudgeRule(head, config.judge_threshold)
    if config.accept == "lenient":
        return LenientRule(config.lenience)
    if config.accept == "topk":
        return TopKRule(config.topk)
    return ExactRule()


def run_to_result(run: PreparedRun, events: list[StepEvent] | None = None) -> dict:
    """Decode to the end (unless ``events`` are given) and build the CLI's JSON object."""
    events = list(run.events()) if events is None else events
    token_ids = [t for e in events for t in e.emitted_ids]
    return {
        "text": run.tokenizer.decode(token_ids, skip_special_tokens=True),
        "token_ids": token_ids,
        "config": run.config.to_dict(),
        "metrics": summarize(events),
        "steps": [e.to_dict() for e in events],
        "theory": run_theory(events),
    }
