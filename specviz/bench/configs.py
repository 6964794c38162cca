"""The benchmark's configuration sets: :class:`BenchConfig` rows and the named sets of them (:data:`CONFIG_SETS`),
each a function of the token count whose first row is the reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from specviz.core.policy import FixedPolicy
from specviz.core.registry import GAMMA_POLICIES
from specviz.models.presets import resolve_preset
from specviz.runtime.config import DecodeConfig

BENCH_GAMMA = 3
"""The γ of the sets' fixed-γ rows, and where their adaptive policies start (the committed results were measured so)."""


@dataclass
class BenchConfig:
    """A row of the benchmark: an engine configuration, or with ``transformers`` transformers' own ``generate`` on the
    same models with their stock linear kernels (assisted generation when the configuration drafts)."""

    label: str
    decode: DecodeConfig
    transformers: bool = False
    extra: dict = field(default_factory=dict)
    quality: bool = False  # also score the output: the target's log-likelihood of it


def standard_configs(max_new_tokens: int, gamma: int = BENCH_GAMMA) -> list[BenchConfig]:
    """AR, SD with each drafter (the drafts over their draft vocabulary and over the full one, the feature head), a
    first run's defaults (the preset's default draft and γ policy: against transformers' ``generate``, as AR is),
    transformers' ``generate`` and its assisted generation on the same models, and the same target in bfloat16 (faster where the
    CPU has native bf16 matmuls, but not token-exact: see ``target_dtype``)."""
    def sd(draft: str, dtype: str = "auto", full_draft_vocab: bool = False) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma=gamma, gamma_policy="fixed", max_new_tokens=max_new_tokens, dtype=dtype,
                            full_draft_vocab=full_draft_vocab)

    ar = DecodeConfig(method="ar", max_new_tokens=max_new_tokens)
    return [
        BenchConfig("ar", ar, extra={"peer": "hf-generate"}),
        BenchConfig("hf-generate", ar, transformers=True),
        BenchConfig(f"sd draft-s γ={gamma}", sd("draft-s")),
        BenchConfig(f"sd draft-m γ={gamma}", sd("draft-m")),
        BenchConfig(f"sd ngram γ={gamma}", sd("ngram")),
        BenchConfig(f"sd head γ={gamma}", sd("head")),
        BenchConfig("sd head γ=2", replace(sd("head"), gamma=2)),
        BenchConfig("defaults", DecodeConfig(max_new_tokens=max_new_tokens), extra={"peer": "hf-generate"}),
        BenchConfig(f"sd draft-s γ={gamma}, full draft vocab", sd("draft-s", full_draft_vocab=True)),
        BenchConfig(f"sd draft-m γ={gamma}, full draft vocab", sd("draft-m", full_draft_vocab=True)),
        BenchConfig(f"hf-assisted draft-s γ={gamma}", sd("draft-s"), transformers=True),
        BenchConfig(f"hf-assisted draft-m γ={gamma}", sd("draft-m"), transformers=True),
        BenchConfig("ar, bf16 target", DecodeConfig(method="ar", max_new_tokens=max_new_tokens, dtype="bfloat16")),
        BenchConfig(f"sd draft-m γ={gamma}, bf16 target", sd("draft-m", "bfloat16")),
        BenchConfig(f"sd ngram γ={gamma}, bf16 target", sd("ngram", "bfloat16")),
    ]


SELECT_CANDIDATES = ("head", "draft-m", "ngram")


def policy_configs(max_new_tokens: int, draft: str = "head") -> list[BenchConfig]:
    """Every γ policy and fixed γ ∈ 1..8 with one draft (draft selection is the ``selection`` set); adaptive
    policies start from :data:`BENCH_GAMMA`."""
    def sd(policy: str, gamma: int = BENCH_GAMMA) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma=gamma, gamma_policy=policy, max_new_tokens=max_new_tokens)

    fixed = [BenchConfig(f"fixed γ={g}", sd("fixed", g)) for g in range(1, 9)]
    adaptive = [BenchConfig(p, sd(p)) for p in GAMMA_POLICIES if p != FixedPolicy.name]  # every registered policy
    return [BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)), *fixed, *adaptive]


def selection_configs(max_new_tokens: int) -> list[BenchConfig]:
    """Per-step draft selection against each of its candidates used alone, all with the online γ policy."""
    def online(**kw) -> DecodeConfig:
        return DecodeConfig(method="sd", gamma=BENCH_GAMMA, gamma_policy="online", max_new_tokens=max_new_tokens, **kw)

    return [BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)),
            *[BenchConfig(f"online {d}", online(draft=d)) for d in SELECT_CANDIDATES],
            BenchConfig(f"online + select({', '.join(SELECT_CANDIDATES)})", online(select=list(SELECT_CANDIDATES)))]


def chain_configs(max_new_tokens: int, mu: int = BENCH_GAMMA, level_gamma: int = 3) -> list[BenchConfig]:
    """AR, plain SD with each draft, and 3- and 4-level chains; ``extra["base"]`` names the row the chain
    extends by one inserted level, for Theorem 3.2's verdict."""
    def sd(draft: str) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma=mu, gamma_policy="fixed", max_new_tokens=max_new_tokens)

    def chain(*names: str) -> DecodeConfig:
        return DecodeConfig(method="sd", chain=list(names), gamma=mu, gamma_policy="fixed", level_gamma=level_gamma,
                            max_new_tokens=max_new_tokens)

    ar = DecodeConfig(method="ar", max_new_tokens=max_new_tokens)
    return [
        BenchConfig("ar", ar, extra={"peer": "hf-generate"}),
        BenchConfig("hf-generate", ar, transformers=True),
        BenchConfig("ngram", sd("ngram")), BenchConfig("draft-s", sd("draft-s")), BenchConfig("draft-m", sd("draft-m")),
        BenchConfig("ngram→draft-s", chain("ngram", "draft-s"), extra={"base": "ngram"}),
        BenchConfig("ngram→draft-m", chain("ngram", "draft-m"), extra={"base": "ngram"}),
        BenchConfig("draft-s→draft-m", chain("draft-s", "draft-m"), extra={"base": "draft-s"}),
        BenchConfig("ngram→draft-s→draft-m", chain("ngram", "draft-s", "draft-m"), extra={"base": "ngram→draft-s"}),
    ]


def judge_configs(max_new_tokens: int, draft: str = "draft-s", gamma: int = 4) -> list[BenchConfig]:
    """Exact SD first (the reference row; greedy and lossless, so its outputs are the target's own), then judge
    decoding at several δ and the two relaxed baselines."""
    def rule(accept: str, **kw) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma=gamma, gamma_policy="fixed", accept=accept, max_new_tokens=max_new_tokens,
                            **kw)

    rows = [("exact", rule("exact")), *[(f"judge δ={d}", rule("judge", judge_threshold=d)) for d in (0.9, 0.7, 0.5)],
            ("lenient l=0.5", rule("lenient", lenience=0.5)), ("top-k k=5", rule("topk", topk=5))]
    return [BenchConfig(label, config, quality=True) for label, config in rows]


def head_configs(max_new_tokens: int, new: str = "head", old: str = "head-v1", gammas: tuple[int, ...] = (1, 2, 3, 4)) -> list[BenchConfig]:
    """AR, then two feature heads at each fixed γ: ``extra["peer"]`` pairs each row of the new head with the old
    head's row at the same γ."""
    def sd(draft: str, gamma: int) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma=gamma, gamma_policy="fixed", max_new_tokens=max_new_tokens)

    return [BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)),
            *[BenchConfig(f"{old} γ={g}", sd(old, g)) for g in gammas],
            *[BenchConfig(f"{new} γ={g}", sd(new, g), extra={"peer": f"{old} γ={g}"}) for g in gammas]]


def tree_configs(max_new_tokens: int, drafts: tuple[str, ...] = ("head", "draft-m"), gammas: tuple[int, ...] = (1, 2, 3, 4),
                 budgets: tuple[int, ...] = (4, 6, 8, 12)) -> list[BenchConfig]:
    """AR, then per draft its chains at γ 1–4 and its token trees of 4, 6, 8 and 12 nodes, dynamic and static; each label
    says how many rows the target verifies (a chain of γ and a tree of γ nodes both verify γ + 1)."""
    def sd(draft: str, **kw) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma_policy="fixed", max_new_tokens=max_new_tokens, **kw)

    return [BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)),
            *[row for d in drafts for row in (
                *[BenchConfig(f"{d} chain γ={g} ({g + 1} rows)", sd(d, gamma=g)) for g in gammas],
                *[BenchConfig(f"{d} {kind} tree {n} ({n + 1} rows)", sd(d, tree_nodes=n, tree_kind=kind))
                  for kind in ("dynamic", "static") for n in budgets])]]


def default_candidates(max_new_tokens: int, draft: str = "head") -> list[BenchConfig]:
    """AR, then the candidates for the defaults of a first run on the offline preset: the draft at fixed γ 1–3, the
    adaptive γ policies (``online`` from γ = 1 and 3) and a small tree; :func:`default_row` names the defaults' row."""
    def sd(**kw) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, max_new_tokens=max_new_tokens, **{"gamma_policy": "fixed", **kw})

    rows = [(f"{draft} fixed γ={g}", sd(gamma=g)) for g in (1, 2, 3)]
    rows += [(f"{draft} online from γ={g}", sd(gamma=g, gamma_policy="online")) for g in (1, 3)]
    rows += [(f"{draft} {p} from γ=3", sd(gamma=3, gamma_policy=p)) for p in ("fsm", "hf-heuristic")]
    rows += [(f"{draft} dynamic tree 4", sd(tree_nodes=4))]
    return [BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)), *[BenchConfig(*row) for row in rows]]


def default_row(configs: list[BenchConfig]) -> str | None:
    """The label of the row whose settings are ``DecodeConfig``'s defaults (its draft the default preset's), apart from
    the token count; None when no row is."""
    base = DecodeConfig()
    for cfg in configs:
        defaults = replace(base, max_new_tokens=cfg.decode.max_new_tokens, draft=base.draft or resolve_preset(base.preset).default_draft)
        if cfg.decode == defaults:
            return cfg.label
    return None


CONFIG_SETS: dict[str, Callable[[int], list[BenchConfig]]] = {"standard": standard_configs, "policies": policy_configs,
                                                              "chains": chain_configs, "judge": judge_configs,
                                                              "judge-head": partial(judge_configs, draft="head"),
                                                              "selection": selection_configs, "heads": head_configs,
                                                              "trees": tree_configs, "defaults": default_candidates}
