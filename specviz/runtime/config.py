"""What a run is asked to do. Every setting is a field of :class:`DecodeConfig` that carries its help, its
choices or range and its label; :meth:`DecodeConfig.validate` is the only validator, and the CLI options, the
UI's controls and the benchmark's rows are generated from these fields and from the strategy registries. Messages
name a setting by its CLI option (:func:`option`); the API and the app respell them with :func:`respelled`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import specviz.methods  # noqa: F401  (the strategies register themselves on import)
from specviz.core.errors import ConfigError
from specviz.core.policy import MAX_GAMMA
from specviz.core.registry import ACCEPT_RULES, GAMMA_POLICIES
from specviz.core.tree import MAX_TREE_NODES, TREE_KINDS
from specviz.models.presets import MODEL_FREE_DRAFTS, default_preset

TREE_POLICIES = ("fixed", "online")
"""The γ policies that choose a tree's node budget."""

APP_MAX_NEW_TOKENS = 512
"""The most tokens one run of the app, its endpoint or ``chain-advisor`` generates (``--max-new-tokens`` allows more)."""


@dataclass(frozen=True)
class Setting:
    """How a setting is described and checked: ``choices`` (a tuple or a function returning one) or a range
    [``low``, ``high``] whose ends are excluded where ``open_low`` / ``open_high``; ``default_text`` says how the
    default is chosen where it depends on the machine."""

    help: str
    label: str = ""
    default_text: str = ""
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def options(self) -> tuple[str, ...]:
        return self.choices() if callable(self.choices) else tuple(self.choices or ())

    def bounds(self) -> str:
        """The range in words: "1–10", "(0, 1]", "≥ 0" ("" without one)."""
        if self.low is None and self.high is None:
            return ""
        if self.high is None:
            return f"{'>' if self.open_low else '≥'} {self.low:g}"
        if isinstance(self.low, int) and isinstance(self.high, int) and not (self.open_low or self.open_high):
            return f"{self.low:,}–{self.high:,}"
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"


def setting(default: Any, help: str, **kw: Any) -> Any:
    """A DecodeConfig field with its :class:`Setting`."""
    if isinstance(default, list):
        return field(default_factory=list, metadata={"setting": Setting(help, **kw)})
    return field(default=default, metadata={"setting": Setting(help, **kw)})


@dataclass
class DecodeConfig:
    """Settings of one generation; ``python -m specviz generate --help`` lists them."""

    preset: str = setting(default_preset(), "model preset: a target and its drafts", label="Preset",
                          default_text="the machine's: `default_preset()`")
    target: str | None = setting(None, "target model: a hub id or a local transformers directory (default: the preset's target)",
                                 label="Target")
    method: str = setting("sd", "sd (speculative) or ar (plain autoregressive)", label="Method", choices=("sd", "ar"))
    draft: str | None = setting(None, "draft: a draft of the preset, 'ngram', or a hub id or local directory holding a model, a feature "
                                "head or a published EAGLE-3 head (default: the preset's first)",
                                label="Draft")
    chain: list[str] = setting([], "polybasic chain, fastest first (the target verifies last)", label="Chain")
    level_gamma: int = setting(4, "draft length of each lower chain level", label="Level γ", low=1, high=MAX_GAMMA)
    select: list[str] = setting([], "drafts to choose from per step (draft selection)", label="Select among drafts")
    gamma: int = setting(1, "tokens drafted per step (fixed, or the start of an adaptive policy)", label="γ", low=1, high=MAX_GAMMA)
    gamma_policy: str = setting("online", "how γ is chosen each step", label="γ policy", choices=lambda: tuple(GAMMA_POLICIES))
    accept: str = setting("exact", "acceptance rule", label="Acceptance rule", choices=lambda: tuple(ACCEPT_RULES))
    judge_threshold: float = setting(0.5, "judge decoding's δ (1 turns the judge off)", label="judge threshold δ", low=0.0, high=1.0)
    lenience: float = setting(1.0, "lenience l: accept with probability min(1, p/(l·q))", label="lenience", low=0, high=1, open_low=True)
    topk: int = setting(5, "top-k rule: accept a draft among the target's k most likely", label="top-k", low=1, high=1000)
    temperature: float = setting(0.0, "sampling temperature (0 = greedy)", label="temperature", low=0)
    top_p: float = setting(1.0, "nucleus sampling mass", label="top-p", low=0, high=1, open_low=True)
    seed: int = setting(0, "random seed of the sampler", label="seed", low=0, high=2**63 - 1)
    max_new_tokens: int = setting(128, "tokens to generate at most", label="max new tokens", low=1, high=4096)
    chat: bool = setting(True, "apply the tokenizer's chat template to the prompt", label="chat template")
    dtype: str = setting("auto", "target dtype: auto (float32 on CPU, exact; bfloat16 on CUDA)", label="dtype",
                         choices=("auto", "float32", "bfloat16"))
    cuda_graphs: str = setting("auto", "CUDA graphs of the verify and draft forwards: auto (on a GPU, ZeroGPU included; a process "
                               "keeps them for its next run of the same shapes; off on a CPU), on or off", label="CUDA graphs",
                               choices=("auto", "on", "off"))
    full_draft_vocab: bool = setting(False, "drafts score the whole vocabulary, not only their draft_vocab.json", label="full draft vocab")
    tree_nodes: int = setting(0, "token tree: nodes drafted and verified per step in one target forward (replaces --gamma; "
                              "0 = a chain of γ)", label="tree nodes", low=0, high=MAX_TREE_NODES)
    tree_branch: int = setting(2, "token tree: children of each expanded node (static: the number of branches)",
                               label="tree branching", low=1, high=8)
    tree_kind: str = setting("dynamic", "token tree: dynamic (EAGLE-2: expand the likeliest nodes, keep the budget's best) "
                             "or static (tree-branch chains from the root)", label="tree kind", choices=TREE_KINDS)

    @staticmethod
    def settings() -> dict[str, Setting]:
        """Every field's :class:`Setting`, in field order."""
        return {f.name: f.metadata["setting"] for f in fields(DecodeConfig)}

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> DecodeConfig:
        """A validated config from loosely typed values (a form's strings and floats, JSON): each is converted
        to its field's type, with a one-line ConfigError naming the setting when it cannot be."""
        known = cls.settings()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown setting '{unknown[0]}'; settings: {', '.join(known)}")
        types = {f.name: f.type for f in fields(cls)}
        return cls(**{name: _convert(option(name), types[name], v) for name, v in values.items()}).validate()

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__.pop("_validated", None)  # a changed setting is checked again
        super().__setattr__(name, value)

    @property
    def validated(self) -> bool:
        """Whether :meth:`validate` passed on this object (a copy made by ``dataclasses.replace`` is checked again)."""
        return self.__dict__.get("_validated", False)

    def validate(self) -> DecodeConfig:
        """This config, once every setting and combination is checked (each entry point calls it once; later stages
        find it done); a one-line ConfigError otherwise."""
        if self.validated:
            return self
        for name, s in self.settings().items():
            value = getattr(self, name)
            if s.choices is not None and value not in s.options():
                raise ConfigError(f"{option(name)} must be one of {', '.join(s.options())}, got '{value}'")
            if s.low is not None or s.high is not None:
                _check_range(option(name), value, s)
        self._validate_combinations()
        self.__dict__["_validated"] = True
        return self

    def _validate_combinations(self) -> None:
        if self.chain:
            if self.method != "sd" or self.draft or self.select:
                raise ConfigError(f"{option('chain')} replaces the draft: use it with {option('method')} sd and without "
                                  f"{option('draft')} or {option('select')}")
            if len(self.chain) < 2 or len(set(self.chain)) != len(self.chain):
                raise ConfigError(f"{option('chain')} needs at least two different models, fastest first (the target verifies last)")
            if set(MODEL_FREE_DRAFTS) & set(self.chain[1:]):
                raise ConfigError(f"{option('chain')}: the n-gram drafter can only be the first (fastest) level: it cannot verify")
        if self.select and (self.method != "sd" or self.draft):
            raise ConfigError(f"{option('select')} chooses the draft per step: use it with {option('method')} sd and without "
                              f"{option('draft')}")
        if len(set(self.select)) != len(self.select) or len(self.select) == 1:
            raise ConfigError(f"{option('select')} needs at least two different drafts")
        if self.tree_nodes:
            self._validate_tree()

    def _validate_tree(self) -> None:
        trees = option("tree_nodes")
        if self.method != "sd" or self.chain or self.select:
            raise ConfigError(f"{trees} drafts a tree with one draft: use it with {option('method')} sd, without "
                              f"{option('chain')} or {option('select')}")
        if self.accept != "exact":
            raise ConfigError(f"{trees}: trees are verified by the exact rule only, not {option('accept')} {self.accept}")
        if self.gamma_policy not in TREE_POLICIES:
            raise ConfigError(f"{trees}: the node budget is fixed or chosen by {option('gamma_policy')} online, "
                              f"not {self.gamma_policy}")
        if self.gamma != DecodeConfig.gamma:
            raise ConfigError(f"{option('gamma')} has no effect with {trees}: the node budget is {trees} "
                              f"(fixed, or where {option('gamma_policy')} online starts)")

    def to_dict(self) -> dict:
        return asdict(self)


def option(name: str) -> str:
    """Setting ``name`` as the CLI spells it, which is how every ConfigError names a setting."""
    return "--" + name.replace("_", "-")


def respelled(exc: ConfigError, spell: Callable[[str], str]) -> ConfigError:
    """``exc`` with every setting's CLI option replaced by ``spell(name)``: the API's ``name=``, the app's labels."""
    names = {option(name): name for name in DecodeConfig.settings()}
    pattern = "|".join(re.escape(o) for o in sorted(names, key=len, reverse=True))
    return ConfigError(re.sub(f"(?:{pattern})(?![\\w-])", lambda m: spell(names[m[0]]), str(exc)))


def _check_range(spelled: str, value: Any, s: Setting) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{spelled} must be a number, got '{value}'")
    too_low = s.low is not None and not (value > s.low if s.open_low else value >= s.low)
    too_high = s.high is not None and not (value < s.high if s.open_high else value <= s.high)
    if not (too_low or too_high or math.isnan(value)):
        return
    if isinstance(s.low, int) and isinstance(s.high, int) and not (s.open_low or s.open_high):
        raise ConfigError(f"{spelled} must be between {s.low} and {s.high}, got {value}")
    raise ConfigError(f"{spelled} must be {'' if s.high is None else 'in '}{s.bounds()}, got {value}")


def _convert(spelled: str, kind: str, value: Any) -> Any:
    """``value`` as a field of type ``kind`` (its annotation's text)."""
    if kind == "bool":
        return value.strip().lower() not in ("", "0", "false", "no", "off") if isinstance(value, str) else bool(value)
    if kind == "list[str]":
        items = value if isinstance(value, list | tuple) else str(value or "").split(",")
        return [str(n).strip() for n in items if str(n).strip()]
    if kind in ("int", "float"):
        return _number(spelled, value, int if kind == "int" else float)
    text = "" if value is None else str(value).strip()
    return (text or None) if kind == "str | None" else text


def _number(spelled: str, value: Any, kind: type) -> int | float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{spelled} is empty")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{spelled} must be a number, got '{value}'") from None
    if not math.isfinite(number):
        raise ConfigError(f"{spelled} must be a finite number, got '{value}'")
    if kind is int:
        if number != int(number):
            raise ConfigError(f"{spelled} must be a whole number, got '{value}'")
        return int(number)
    return number
