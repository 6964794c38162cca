"""What a run is asked to do, validated into one-line error messages before any model is touched."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specviz.core.errors import ConfigError
from specviz.models.presets import NGRAM_DRAFT, OFFLINE_PRESET

METHODS = ("ar", "sd")
GAMMA_POLICIES = ("fixed", "fsm", "cache-fsm", "online", "rl", "hf-heuristic", "confidence")
ACCEPT_RULES = ("exact", "judge", "lenient", "topk")
DTYPES = ("auto", "float32", "bfloat16")
MAX_GAMMA = 32
MAX_TOPK = 1000
MAX_NEW_TOKENS = 4096




@dataclass
class DecodeConfig:
    """Settings of one generation (mirrors the CLI options of ``python -m specviz generate``)."""

    preset: str = OFFLINE_PRESET
    method: str = "sd"
    draft: str | None = None
    chain: list[str] = field(default_factory=list)
    level_gamma: int = 4
    select: list[str] = field(default_factory=list)
    gamma: int = 3  # the longest verify that runs on the fast narrow kernel on CPU (see models.PackedLinear)
    gamma_policy: str = "fixed"
    accept: str = "exact"
    judge_threshold: float = 0.5
    lenience: float = 1.0
    topk: int = 5
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    chat: bool = True
    dtype: str = "auto"
    full_draft_vocab: bool = False

    def validate(self) -> DecodeConfig:
        if self.method not in METHODS:
            raise ConfigError(f"--method must be one of {', '.join(METHODS)}, got '{self.method}'")
        if not 1 <= self.gamma <= MAX_GAMMA:
            raise ConfigError(f"--gamma must be between 1 and {MAX_GAMMA}, got {self.gamma}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS}, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        _check_choice("--gamma-policy", self.gamma_policy, GAMMA_POLICIES)
        _check_choice("--accept", self.accept, ACCEPT_RULES)
        _check_choice("--dtype", self.dtype, DTYPES)
        if not 0 <= self.judge_threshold <= 1:
            raise ConfigError(f"--judge-threshold must be in [0, 1], got {self.judge_threshold}")
        if not 0 < self.lenience <= 1:
            raise ConfigError(f"--lenience must be in (0, 1], got {self.lenience}")
        if not 1 <= self.topk <= MAX_TOPK:
            raise ConfigError(f"--topk must be between 1 and {MAX_TOPK}, got {self.topk}")
        self._validate_chain()
        if self.select and (self.method != "sd" or self.draft):
            raise ConfigError("--select chooses the draft per step: use it with --method sd and without --draft")
        if len(set(self.select)) != len(self.select) or len(self.select) == 1:
            raise ConfigError("--select needs at least two different drafts")
        return self

    def _validate_chain(self) -> None:
        if not 1 <= self.level_gamma <= MAX_GAMMA:
            raise ConfigError(f"--level-gamma must be between 1 and {MAX_GAMMA}, got {self.level_gamma}")
        if not self.chain:
            return
        if self.method != "sd" or self.draft or self.select:
            raise ConfigError("--chain replaces the draft: use it with --method sd and without --draft or --select")
        if len(self.chain) < 2 or len(set(self.chain)) != len(self.chain):
            raise ConfigError("--chain needs at least two different models, fastest first (the target verifies last)")
        if NGRAM_DRAFT in self.chain[1:]:
            raise ConfigError("--chain: the n-gram drafter can only be the first (fastest) level: it cannot verify")

    def to_dict(self) -> dict:
        return asdict(self)


def _check_choice(option: str, value: str, available: tuple[str, ...]) -> None:
    if value not in available:
        raise ConfigError(f"{option} must be one of {', '.join(available)}, got '{value}'")
