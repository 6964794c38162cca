"""From a :class:`DecodeConfig` and a prompt to a running decode: models loaded once per process,
strategies built by name, and the JSON result of a finished run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specviz.core.acceptance import ExactRule, LenientRule, TopKRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import Drafter, ModelDrafter, NGramDrafter
from specviz.core.engine import StepEvent, decode
from specviz.core.errors import ConfigError
from specviz.core.sampling import Sampler
from specviz.methods.chain import build_chain
from specviz.methods.feature_head import FeatureDrafter, is_feature_head
from specviz.methods.judge import JudgeRule
from specviz.methods.policies import make_policy
from specviz.methods.predictor import AcceptancePredictor
from specviz.methods.selection import FirstDraft, OnlineSelector, PerDrafterPolicy
from specviz.models.backends import cached_model
from specviz.models.loading import LoadedModel, check_shared_vocab, shared_vocab_size
from specviz.models.presets import NGRAM_DRAFT, resolve_draft, resolve_preset
from specviz.models.prompts import encode_prompt, stop_ids_of
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig


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
        from specviz.methods.judge import JudgeHead, default_head_path

        head = JudgeHead.load(default_head_path(target.name), target.name, target.model.config.hidden_size)
        return JudgeRule(head, config.judge_threshold)
    if config.accept == "lenient":
        return LenientRule(config.lenience)
    if config.accept == "topk":
        return TopKRule(config.topk)
    return ExactRule()


