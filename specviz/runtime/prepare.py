"""From a :class:`DecodeConfig` and a prompt to a running decode: models loaded once per process,
strategies built by name, and the JSON result of a finished run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from specviz.core.acceptance import ExactRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import SINGLE_PATH, Drafter
from specviz.core.engine import decode
from specviz.core.errors import ConfigError
from specviz.core.policy import MAX_GAMMA, FirstDraft
from specviz.core.record import StepEvent
from specviz.core.registry import ACCEPT_RULES, DRAFTERS, GAMMA_POLICIES
from specviz.core.sampling import Sampler
from specviz.core.tree import MAX_TREE_NODES, TreeShape
from specviz.methods.chain import build_chain
from specviz.methods.policies import make_policy
from specviz.methods.predictor import AcceptancePredictor
from specviz.methods.selection import OnlineSelector, PerDrafterPolicy
from specviz.models.backends import cached_model
from specviz.models.backends.cpu import verify_profile
from specviz.models.loaded import LoadedModel
from specviz.models.loading import check_shared_vocab, describe_run_machine, shared_vocab_size
from specviz.models.presets import Preset, check_access, resolve_draft, resolve_preset
from specviz.models.prompts import encode_prompt, stop_ids_of
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig


@dataclass(frozen=True)
class RunPlan:
    """What the views of a run need, known before any model runs: the settings, the tokenizer, the prompt's ids and
    the target's name."""

    config: DecodeConfig
    tokenizer: object
    prompt_ids: list[int]
    target: str


def plan(config: DecodeConfig, prompt: str, bank: ModelBank) -> RunPlan:
    """Validate the settings and encode the prompt with the preset's tokenizer; loads no model weights and computes
    nothing on a device (on ZeroGPU the decode itself runs in another process)."""
    preset = checked(config, prompt)
    tokenizer = bank.tokenizer(preset.target)
    return RunPlan(config, tokenizer, encode_prompt(tokenizer, prompt, config.chat), preset.target_name)


def checked(config: DecodeConfig, prompt: str) -> Preset:
    """The run's preset, once its settings and prompt are valid (a one-line ConfigError / ModelLoadError otherwise)."""
    config.validate()
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")
    return run_preset(config)


def run_preset(config: DecodeConfig) -> Preset:
    """The preset a run uses: the named one, or with ``target`` set, that target with none of the preset's drafts
    (they belong to the preset's own target) unless it is the preset's target."""
    preset = resolve_preset(config.preset)
    if config.target is None or config.target == preset.target:
        check_access(preset)
        return preset
    return Preset(preset.name, config.target, {}, f"{config.target} (given as the target)")


MIN_CAPACITY = 256
"""The smallest fixed KV capacity of a GPU run (positions): short runs share it, and its graphs."""
BASELINE_SETTINGS = ("preset", "target", "temperature", "top_p", "seed", "max_new_tokens", "chat", "dtype", "cuda_graphs")
"""The settings a plain target run reads: an AR baseline keeps them and takes every other setting's default, so
a setting added for drafting never reaches a baseline."""


def baseline_config(config: DecodeConfig) -> DecodeConfig:
    """The autoregressive baseline of any run: the same target, prompt handling, sampling and length, no drafting."""
    return type(config)(method="ar", **{name: getattr(config, name) for name in BASELINE_SETTINGS}).validate()


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

    @property
    def plan(self) -> RunPlan:
        return RunPlan(self.config, self.tokenizer, self.prompt_ids, self.target.name)

    @property
    def machine(self) -> str:
        """The hardware, threads and torch, and on a CPU the target's linear kernel per row count."""
        return describe_run_machine(self.target.lm.model)

    def events(self, record: bool = True) -> Iterator[StepEvent]:
        """The decode's steps; without ``record`` they leave out what only the views read (see ``decode``)."""
        gamma = self.config.tree_nodes or self.config.gamma  # a tree's node budget: validate() refuses another --gamma with it
        selecting = len(self.drafters) > 1
        prices = selecting or GAMMA_POLICIES[self.config.gamma_policy].prices_verify
        profile = verify_profile(self.target, MAX_GAMMA) if prices and self.drafters else {}
        selector, length = FirstDraft(), make_policy(self.config.gamma_policy, gamma, profile=profile)
        if selecting:  # the selector's estimates are the policies' too
            predictor = AcceptancePredictor.load()
            selector = OnlineSelector(priors=predictor.priors(self.drafters, self.prompt_ids) if predictor else None,
                                      profile=profile)
            length = PerDrafterPolicy(partial(make_policy, self.config.gamma_policy, gamma, selector.estimates))
        return decode(self.target, self.prompt_ids, drafters=self.drafters, rule=self.rule,
                      policy=length, selector=selector, sampler=self.sampler,
                      max_new_tokens=self.config.max_new_tokens, stop_ids=self.stop_ids, tree=tree_shape(self.config),
                      record=record)


def tree_shape(config: DecodeConfig) -> TreeShape:
    """How the run's drafts grow: a token tree's branching and kind (its budget and depth are each step's), or a chain."""
    return TreeShape(config.tree_branch, config.tree_kind) if config.tree_nodes else SINGLE_PATH


@dataclass
class DraftContext:
    """What a drafter kind's ``from_source`` may use to build itself: the run's settings, the target (loaded and
    cached), the draft models loaded for this run and the process's model bank; ``capacity`` and ``graphs``, the
    static shapes and CUDA graphs of the run's caches (see :func:`static_shapes`)."""

    config: DecodeConfig
    bank: ModelBank
    target_lm: LoadedModel
    target: CachedModel
    models: dict[str, LoadedModel]
    capacity: int | None = None
    graphs: bool = False

    def draft_model(self, name: str) -> CachedModel:
        """The cached draft model ``name`` over the target's vocabulary (int8 weights where they pay)."""
        return cached_model(self.models[name], self.target.vocab_size, self.config.full_draft_vocab, int8=True,
                            capacity=self.capacity, graphs=self.graphs, keep=True)


def static_shapes(config: DecodeConfig, device: torch.device, prompt_len: int) -> tuple[int | None, bool]:
    """The fixed KV capacity (positions) of the run's caches, and whether their forwards run as CUDA graphs. On a
    GPU every cache has room for the prompt, every requested token and the largest tree's nodes, rounded up to a power of
    two (at least :data:`MIN_CAPACITY`), so no shape changes while decoding and runs of similar lengths share shapes, and
    with them recorded graphs (:mod:`specviz.models.backends.kept`). Graphs follow ``--cuda-graphs`` (auto: on, ZeroGPU
    included: recorded inside each call, or kept from the worker's last call, they beat eager forwards at every length
    measured in a forked worker, results/cuda/2026-11-28-nvidia-h200.md; where a worker refuses a recording, the forwards
    run eagerly, see :class:`~specviz.models.backends.graphs.Graphs`). A CPU keeps the growing cache and no graphs."""
    if device.type != "cuda":
        if config.cuda_graphs == "on":
            raise ConfigError(f"--cuda-graphs on needs a CUDA device; this run's target is on {device.type}")
        return None, False
    needed = prompt_len + config.max_new_tokens + 1 + (MAX_TREE_NODES if config.tree_nodes else 0)
    return max(MIN_CAPACITY, 1 << (needed - 1).bit_length()), config.cuda_graphs != "off"


def drafter_kind(source: str | LoadedModel) -> type[Drafter]:
    """The drafter kind for a draft source: the most recently registered kind that claims it (specific kinds
    register after the model kind, which claims any other source)."""
    return next(kind for kind in reversed(list(DRAFTERS.values())) if kind.claims(source))


def run_drafts(config: DecodeConfig, preset: Preset) -> list[tuple[str, str]]:
    """(name, source) of every draft a run of ``config`` uses: the chain, the selection, or the one draft (the
    preset's first by default); none for AR."""
    if config.method != "sd":
        return []
    names = config.chain or config.select or [config.draft or preset.default_draft]
    return [(name, resolve_draft(preset, name)) for name in names]


def prepare(config: DecodeConfig, prompt: str, bank: ModelBank, *, target: LoadedModel | None = None, tokenizer=None,
            drafts: list[tuple[str, str | LoadedModel]] | None = None) -> PreparedRun:
    """Validate, load (or reuse) the models, encode the prompt; raises ConfigError / ModelLoadError.

    The preset names the target and the drafts unless ``target`` (with its ``tokenizer``) and ``drafts``, (name,
    source or loaded model) pairs, are given."""
    preset = checked(config, prompt)
    drafts = run_drafts(config, preset) if drafts is None else drafts
    if target is None:
        tokenizer, target = bank.tokenizer(preset.target), bank.target(preset, config.dtype)
    prompt_ids = encode_prompt(tokenizer, prompt, config.chat)
    if target.max_positions - len(prompt_ids) < config.max_new_tokens:
        raise ConfigError(f"the prompt is {len(prompt_ids)} tokens; with --max-new-tokens {config.max_new_tokens} it exceeds "
                          f"the target's context of {target.max_positions} tokens")
    kinds = [(name, source, drafter_kind(source)) for name, source in drafts]
    heads = [name for name, _, kind in kinds if kind.reads_features]
    if heads and config.chain:
        raise ConfigError(f"--chain: '{heads[0]}' is a feature head; it drafts from the target's own states, "
                          "so it cannot be a level of a chain")
    models = {name: source if isinstance(source, LoadedModel) else bank.model(source, name)
              for name, source, kind in kinds if kind.loads_model}
    for name, source, _ in kinds:
        if name in models and isinstance(source, str) and not (Path(source) / "specviz.json").exists():
            check_shared_vocab(tokenizer, bank.tokenizer(source), name)
    rule = ACCEPT_RULES[config.accept].from_settings(config, target)
    n_layers = target.model.config.num_hidden_layers
    taps = tuple(sorted({i for name, source, kind in kinds for i in kind.reads_layers(source, n_layers)} | {*rule.reads_layers(n_layers)}))
    capacity, graphs = static_shapes(config, target.device, len(prompt_ids))
    cached = cached_model(target, shared_vocab_size(target, *models.values()), taps=taps, capacity=capacity, graphs=graphs, keep=True)
    context = DraftContext(config, bank, target, cached, models, capacity, graphs)
    drafters = [kind.from_source(name, source, context) for name, source, kind in kinds]
    if config.chain:
        drafters = [build_chain(drafters[0], [d.model for d in drafters[1:]], config.level_gamma)]
    sampler = Sampler(config.temperature, config.top_p, config.seed, target.device)
    return PreparedRun(config, tokenizer, prompt_ids, cached, drafters, sampler, stop_ids_of(target, tokenizer), rule)
