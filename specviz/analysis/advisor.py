"""``python -m specviz chain-advisor``: measure a preset's models on a few prompts, rank every chain
(AR and plain two-model SD included) by Lemma 3.1's predicted throughput, then run the best ones and
print predicted against measured tokens/s.

Measured inputs: each model's forward time as a verifier (γ + 1 tokens) and as a drafter (one token),
and for every (verifier, faster drafter) pair the acceptance length L with draft length γ. A chain's
predicted time per token is ``Σ_i T_i/L_i + β·T_n/L_{n−1}`` with β = γ model forwards (1 for n-grams).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path

from specviz.analysis.suites import load_suite
from specviz.analysis.theory import run_theory
from specviz.core.drafters import Drafter, ModelDrafter, NGramDrafter
from specviz.core.engine import decode
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler
from specviz.methods.feature_head import is_feature_head
from specviz.models.backends import cached_model
from specviz.models.presets import NGRAM_DRAFT, resolve_preset
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare

TARGET = "target"


@dataclass
class Pair:
    """One verifier checking one drafter, measured: verify forward ms, drafting pass ms, acceptance length."""

    verify_ms: float
    draft_ms: float
    length: float


def chain_label(chain: list[str]) -> str:
    return "ar" if not chain else "→".join([*chain, TARGET])


def measure_pairs(preset: str, bank: ModelBank, prompts: list[str], gamma: int, max_new_tokens: int) -> tuple[dict, list[str]]:
    """(pairs[(verifier, drafter)], model names fastest first) for every verifier and every faster drafter;
    pairs[(name, None)] is the model decoding alone."""
    runs = {p: prepare(DecodeConfig(preset=preset, method="ar", max_new_tokens=max_new_tokens), p, bank) for p in prompts}
    first = next(iter(runs.values()))
    vocab = first.target.vocab_size
    models = {TARGET: first.target.lm, **{n: bank.model(src, n) for n, src in resolve_preset(preset).drafts.items()
                                          if not is_feature_head(Path(src))}}  # a head drafts for the target only

    def drafter(name: str) -> Drafter:
        return NGramDrafter() if name == NGRAM_DRAFT else ModelDrafter(cached_model(models[name], vocab, full_vocab=False, int8=True))

    def pair(verifier: str, name: str | None) -> Pair:
        verify, draft, lengths = [], [], []
        for run in runs.values():
            level = cached_model(models[verifier], vocab, int8=verifier != TARGET)  # a draft verifying, as in a chain
            events = list(decode(level, run.prompt_ids, drafters=[drafter(name)] if name else [],
                                 policy=FixedPolicy(gamma), sampler=Sampler(), max_new_tokens=max_new_tokens,
                                 stop_ids=run.stop_ids))
            levels = run_theory(events)["levels"]
            verify.append(levels[0]["T_ms"])
            draft.append(levels[-1]["T_ms"] if name else 0.0)
            lengths.append(levels[0]["L"])
        return Pair(statistics.mean(verify), statistics.mean(draft), statistics.mean(lengths))

    # each model alone (AR) gives its one-token cost, which orders the chain; n-gram lookup is the fastest level
    pairs = {(name, None): pair(name, None) for name in models}
    order = sorted(models, key=lambda n: pairs[(n, None)].verify_ms)
    for i, verifier in enumerate(order):
        for name in [NGRAM_DRAFT, *order[:i]]:
            pairs[(verifier, name)] = pair(verifier, name)
    return pairs, [NGRAM_DRAFT, *order]


def candidate_chains(order: list[str]) -> list[list[str]]:
    """Every chain, fastest first, whose levels keep the speed order; [] is AR, one name is plain SD."""
    below_target = order[:-1]
    return [list(c) for k in range(len(below_target) + 1) for c in itertools.combinations(below_target, k)]


def predicted_tokens_per_s(chain: list[str], pairs: dict, gamma: int) -> float:
    """Lemma 3.1 per token for the chain (target implied last)."""
    if not chain:
        return 1e3 / pairs[(TARGET, None)].verify_ms
    levels = [TARGET, *reversed(chain)]
    per_token = sum(pairs[(v, d)].verify_ms / pairs[(v, d)].length for v, d in zip(levels, levels[1:]))
    bottom = pairs[(levels[-2], levels[-1])]
    beta = 1 if chain[0] == NGRAM_DRAFT else gamma
    return 1e3 / (per_token + beta * bottom.draft_ms / bottom.length)


LEVEL_GAMMA = 3
"""The fixed γ of every level the advisor measures, unless told another."""


def measured_tokens_per_s(preset: str, chain: list[str], prompts: list[str], bank: ModelBank, gamma: int, max_new_tokens: int) -> float:
    if not chain:
        config = DecodeConfig(preset=preset, method="ar", max_new_tokens=max_new_tokens)
    elif len(chain) == 1:
        config = DecodeConfig(preset=preset, draft=chain[0], gamma=gamma, gamma_policy="fixed", max_new_tokens=max_new_tokens)
    else:
        config = DecodeConfig(preset=preset, chain=chain, gamma=gamma, gamma_policy="fixed", level_gamma=gamma,
                              max_new_tokens=max_new_tokens)
    rates = []
    for prompt in prompts:
        events = list(prepare(config, prompt, bank).events())
        rates.append(1e3 * sum(len(e.emitted_ids) for e in events) / sum(e.total_ms for e in events))
    return statistics.median(rates)


def advise(preset: str, n_prompts: int = 3, gamma: int = LEVEL_GAMMA, max_new_tokens: int = 48, top: int = 3) -> list[dict]:
    """Rank every chain by predicted decode tok/s, then measure the top ones, the best two-model SD and AR."""
    bank = ModelBank()
    prompts = [item["prompt"] for item in load_suite("all", 1)[:n_prompts]]
    pairs, order = measure_pairs(preset, bank, prompts, gamma, max_new_tokens)
    ranked = sorted(candidate_chains(order), key=lambda c: -predicted_tokens_per_s(c, pairs, gamma))
    best_plain = next(c for c in ranked if len(c) == 1)
    to_run = [*ranked[:top], *(c for c in (best_plain, []) if c not in ranked[:top])]
    rows = []
    for chain in ranked:
        row = {"chain": chain_label(chain), "predicted tok/s": predicted_tokens_per_s(chain, pairs, gamma), "measured tok/s": None}
        if chain in to_run:
            row["measured tok/s"] = measured_tokens_per_s(preset, chain, prompts, bank, gamma, max_new_tokens)
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'chain':<40} {'predicted tok/s':>16} {'measured tok/s':>15} {'error':>7}"]
    for r in rows:
        measured = r["measured tok/s"]
        tail = f"{measured:>15.1f} {100 * (r['predicted tok/s'] / measured - 1):>+6.0f}%" if measured else f"{'–':>15} {'':>7}"
        lines.append(f"{r['chain']:<40} {r['predicted tok/s']:>16.1f} {tail}")
    return "\n".join(lines)
