"""Interleaved benchmark: every configuration runs on the same prompt back to back (order rotated per
prompt) after a warm-up, and speed is reported as the median of per-prompt ratios to AR."""

from __future__ import annotations

import csv
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

from specviz.analysis.cost_model import predict_run
from specviz.analysis.quality import is_correct, quality_table, speed_quality_svg, target_logprob
from specviz.analysis.suites import load_suite
from specviz.analysis.theory import insertion_helps, run_theory
from specviz.core.metrics import summarize
from specviz.core.policy import LengthPolicy
from specviz.core.registry import GAMMA_POLICIES
from specviz.core.timing import Stopwatch
from specviz.models.backends.cpu import is_packed
from specviz.models.loading import describe_hardware
from specviz.models.presets import resolve_preset
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare

SPLIT = ("draft_ms", "verify_ms", "overhead_ms")
BENCH_GAMMA = 3
"""The γ of the sets' fixed-γ rows, and where their adaptive policies start (the committed results were measured so)."""


@dataclass
class BenchConfig:
    """A row of the benchmark: an engine configuration or transformers' assisted generation."""

    label: str
    decode: DecodeConfig
    hf_assisted: bool = False
    extra: dict = field(default_factory=dict)
    quality: bool = False  # also score the output: the target's log-likelihood of it


def standard_configs(max_new_tokens: int, gamma: int = BENCH_GAMMA) -> list[BenchConfig]:
    """AR, SD with each drafter (the drafts over their draft vocabulary and over the full one, the feature head),
    transformers' assisted generation on the same draft models, and the same target in bfloat16 (faster where the
    CPU has native bf16 matmuls, but not token-exact: see ``target_dtype``)."""
    def sd(draft: str, dtype: str = "auto", full_draft_vocab: bool = False) -> DecodeConfig:
        return DecodeConfig(method="sd", draft=draft, gamma=gamma, gamma_policy="fixed", max_new_tokens=max_new_tokens, dtype=dtype,
                            full_draft_vocab=full_draft_vocab)

    return [
        BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)),
        BenchConfig(f"sd draft-s γ={gamma}", sd("draft-s")),
        BenchConfig(f"sd draft-m γ={gamma}", sd("draft-m")),
        BenchConfig(f"sd ngram γ={gamma}", sd("ngram")),
        BenchConfig(f"sd head γ={gamma}", sd("head")),
        BenchConfig("sd head γ=2", replace(sd("head"), gamma=2)),
        BenchConfig(f"sd draft-s γ={gamma}, full draft vocab", sd("draft-s", full_draft_vocab=True)),
        BenchConfig(f"sd draft-m γ={gamma}, full draft vocab", sd("draft-m", full_draft_vocab=True)),
        BenchConfig(f"hf-assisted draft-s γ={gamma}", sd("draft-s"), hf_assisted=True),
        BenchConfig(f"hf-assisted draft-m γ={gamma}", sd("draft-m"), hf_assisted=True),
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
    adaptive = [BenchConfig(p, sd(p)) for p in GAMMA_POLICIES if p != LengthPolicy.name]  # every registered policy
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

    return [
        BenchConfig("ar", DecodeConfig(method="ar", max_new_tokens=max_new_tokens)),
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


def run_engine(cfg: BenchConfig, prompt: str, bank: ModelBank) -> dict:
    run = prepare(cfg.decode, prompt, bank)
    events = list(run.events(record=False))  # nothing display-only is read inside the timed steps
    ids = [t for e in events for t in e.emitted_ids]
    result = {**summarize(events), "token_ids": ids, "theory": run_theory(events), "events": events,
              "text": run.tokenizer.decode(ids, skip_special_tokens=True)}
    if cfg.quality:
        result["target_logprob"] = target_logprob(run.target.lm, run.prompt_ids, ids)
    return result


@torch.inference_mode()
def hf_assisted_generate(target: torch.nn.Module, draft: torch.nn.Module, prompt_ids: list[int], gamma: int,
                         max_new_tokens: int, stop_ids: list[int]) -> tuple[list[int], float]:
    """transformers' own assisted generation (greedy, constant γ set on the assistant's generation_config):
    the new ids and the wall seconds, measured after the GPU (if any) has finished."""
    gc = draft.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = gamma, "constant", 0.0
    ids = torch.tensor([prompt_ids], device=target.device)
    watch = Stopwatch(target.device)
    start = watch.mark()
    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, do_sample=False,
                          max_new_tokens=max_new_tokens, eos_token_id=stop_ids or None, pad_token_id=(stop_ids or [0])[0])
    return out[0, ids.shape[1]:].tolist(), watch.seconds(start, watch.mark())


def run_hf_assisted(cfg: BenchConfig, prompt: str, bank: ModelBank) -> dict:
    """The peer row: :func:`hf_assisted_generate` on the pair and γ of ``cfg``."""
    run = prepare(cfg.decode, prompt, bank)
    new, wall = hf_assisted_generate(run.target.lm.model, run.drafters[0].model.lm.model, run.prompt_ids, cfg.decode.gamma,
                                     cfg.decode.max_new_tokens, run.stop_ids)
    return {"new_tokens": len(new), "wall_s": wall, "tokens_per_s": len(new) / wall, "token_ids": new}


def run_one(cfg: BenchConfig, prompt: str, bank: ModelBank) -> dict:
    return (run_hf_assisted if cfg.hf_assisted else run_engine)(cfg, prompt, bank)


def rotations(configs: list[BenchConfig], prompt_index: int, repeats: int) -> list[list[BenchConfig]]:
    """The order of each of ``repeats`` rounds on one prompt: rotated by the prompt's index, round r by a further
    r/repeats of the list, so that the rounds spread each configuration over the prompt's time."""
    n = len(configs)
    starts = [(prompt_index + r * n // repeats) % n for r in range(repeats)]
    return [configs[k:] + configs[:k] for k in starts]


def fastest_runs(prompt: str, configs: list[BenchConfig], bank: ModelBank, prompt_index: int, repeats: int) -> dict[str, dict]:
    """Each configuration's fastest run (least wall time) over ``repeats`` interleaved rounds. On a shared
    machine a run is sometimes slowed several-fold by other load; the minimum is the run least disturbed
    (as ``timeit`` advises), and greedy decoding emits the same tokens in every round."""
    best: dict[str, dict] = {}
    for order in rotations(configs, prompt_index, repeats):
        for cfg in order:
            r = run_one(cfg, prompt, bank)
            if cfg.label not in best or r["wall_s"] < best[cfg.label]["wall_s"]:
                best[cfg.label] = r
    return best


def run_benchmark(suite: str, config_set: str, per_category: int, max_new_tokens: int, out: Path,
                  configs: list[BenchConfig] | None = None, repeats: int = 1) -> list[dict]:
    configs = configs or CONFIG_SETS[config_set](max_new_tokens)
    prompts = load_suite(suite, per_category)
    bank = ModelBank()
    for cfg in configs:  # warm-up: load every model, touch every code path once
        run_one(cfg, prompts[0]["prompt"], bank)
    rows = []
    for i, item in enumerate(prompts):
        results = fastest_runs(item["prompt"], configs, bank, i, repeats)
        ar = results[configs[0].label]
        for cfg in configs:
            r = results[cfg.label]
            rows.append({
                "prompt_id": item["id"], "category": item["category"], "config": cfg.label,
                "new_tokens": r["new_tokens"], "wall_s": round(r["wall_s"], 4), "tokens_per_s": round(r["tokens_per_s"], 3),
                "speedup": round(r["tokens_per_s"] / ar["tokens_per_s"], 4),
                "mean_accept_len": round(r.get("mean_accept_len", float("nan")), 4),
                "accept_rate": round(r.get("accept_rate", float("nan")), 4),
                "same_tokens_as_ar": r["token_ids"] == ar["token_ids"],
                "draft_ms": round(r.get("draft_ms", 0.0), 2), "verify_ms": round(r.get("verify_ms", 0.0), 2),
                "overhead_ms": round(r.get("overhead_ms", 0.0), 2),
                "engine_overhead_frac": round(r.get("engine_overhead_frac", float("nan")), 4),
                "per_position_accept": json.dumps([round(x, 3) for x in r.get("per_position_accept", [])]),
                **theory_columns(r.get("theory")),
                "model_speedup": round(model_speedup(r, ar), 4),
                "target_logprob": round(r.get("target_logprob", float("nan")), 4),
                "correct": is_correct(r.get("text", ""), item["expected"]) if "expected" in item else "",
            })
        print(f"[{i + 1}/{len(prompts)}] {item['id']}: " + ", ".join(
            f"{c.label} {results[c.label]['tokens_per_s']:.1f}" for c in configs), flush=True)
    write_results(rows, configs, out, max_new_tokens, describe_machine(bank), repeats)
    return rows


def describe_machine(bank: ModelBank) -> str:
    """The hardware and each model's dtype: results from a machine with native bf16 matmuls and one without are not
    comparable."""
    dtypes = ", ".join(f"{m.name} {str(m.dtype).removeprefix('torch.')}{' (oneDNN-packed linears)' if is_packed(m.model) else ''}"
                       for m in bank.loaded_models())
    return f"{describe_hardware()}; {dtypes}"




def theory_columns(theory: dict | None) -> dict:
    """Lemma 3.1's prediction and the per-level T_i (ms) and L_i of one run, for the CSV."""
    if not theory:
        return {"predicted_tokens_per_s": float("nan"), "decode_tokens_per_s": float("nan"), "levels": "[]"}
    levels = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in lv.items()} for lv in theory["levels"]]
    return {"predicted_tokens_per_s": round(theory["predicted_tokens_per_s"] or float("nan"), 3),
            "decode_tokens_per_s": round(theory["measured_tokens_per_s"] or float("nan"), 3), "levels": json.dumps(levels)}


def model_speedup(run: dict, ar: dict) -> float:
    """The cost model's predicted speedup of ``run`` (:func:`specviz.analysis.cost_model.predict_run`), its verify cost
    measured against the AR run on the same prompt; NaN for a run that never drafted."""
    t1 = ar["verify_ms"] / ar["target_forwards"] if ar.get("target_forwards") else None
    prediction = predict_run(run.get("events") or [], t1)
    return prediction["predicted_speedup"] if prediction else float("nan")


def model_table(rows: list[dict], labels: list[str], tolerance: float = 0.15) -> list[dict]:
    """Per speculative configuration: the cost model's predicted speedup against the measured one (medians over
    prompts), the median per-prompt error and the share of prompts whose measured speedup is within ``tolerance``."""
    out = []
    for label in labels:
        rs = [r for r in rows if r["config"] == label and r.get("model_speedup", float("nan")) == r.get("model_speedup")]
        if not rs:
            continue
        errors = [r["speedup"] / r["model_speedup"] - 1 for r in rs]
        out.append({"config": label, "predicted speedup": statistics.median(r["model_speedup"] for r in rs),
                    "measured speedup": statistics.median(r["speedup"] for r in rs),
                    "median error %": 100 * statistics.median(errors),
                    f"prompts within {tolerance:.0%}": f"{sum(abs(e) <= tolerance for e in errors)}/{len(rs)}"})
    return out


def theory_table(rows: list[dict], labels: list[str]) -> list[dict]:
    """Per configuration: Lemma 3.1's predicted against the measured decode tok/s, and the mean T_i / L_i."""
    out = []
    for label in labels:
        rs = [r for r in rows if r["config"] == label]
        levels = [json.loads(r["levels"]) for r in rs]
        names = [lv["name"] for lv in levels[0]]
        cells = []
        for i, name in enumerate(names):
            t = statistics.mean(lvs[i]["T_ms"] for lvs in levels)
            ell = [lvs[i].get("L") for lvs in levels if lvs[i].get("L") is not None]
            rest = f"L={statistics.mean(ell):.2f}" if ell else f"β={statistics.mean(lvs[i]['beta'] for lvs in levels):.1f}"
            cells.append(f"{name}: T={t:.1f} ms, {rest}")
        errors = [r["predicted_tokens_per_s"] / r["decode_tokens_per_s"] - 1 for r in rs]
        out.append({"config": label, "levels (mean T_i, L_i)": "; ".join(cells),
                    "predicted tok/s": statistics.median(r["predicted_tokens_per_s"] for r in rs),
                    "measured decode tok/s": statistics.median(r["decode_tokens_per_s"] for r in rs),
                    "median error %": 100 * statistics.median(errors), "max abs error %": 100 * max(abs(e) for e in errors)})
    return out


def _level_mean(runs: list[list[dict]], index: int, key: str) -> float:
    """Mean of one level's ``key`` over runs (each run's levels top first)."""
    return statistics.mean(levels[index][key] for levels in runs)


def insertion_table(rows: list[dict], configs: list[BenchConfig]) -> list[dict]:
    """Theorem 3.2 for every chain that extends a base row by one level: the verdict from mean T / L
    against the measured sign (median per-prompt tok/s ratio)."""
    out = []
    for cfg in configs:
        base = cfg.extra.get("base")
        if not base:
            continue
        new_rows = [r for r in rows if r["config"] == cfg.label]
        base_rows = {r["prompt_id"]: r for r in rows if r["config"] == base}
        new_levels = [json.loads(r["levels"]) for r in new_rows]
        base_names = [lv["name"] for lv in json.loads(next(iter(base_rows.values()))["levels"])]
        names = [lv["name"] for lv in new_levels[0]]
        i = next(k for k, name in enumerate(names) if name not in base_names)  # the inserted level
        l_before = statistics.mean(json.loads(base_rows[r["prompt_id"]]["levels"])[i - 1]["L"] for r in new_rows)
        t_new, t_i = _level_mean(new_levels, i, "T_ms"), _level_mean(new_levels, i - 1, "T_ms")
        l_new, l_after = _level_mean(new_levels, i, "L"), _level_mean(new_levels, i - 1, "L")
        helps = insertion_helps(t_new, t_i, l_new, l_before, l_after)
        ratio = statistics.median(r["tokens_per_s"] / base_rows[r["prompt_id"]]["tokens_per_s"] for r in new_rows)
        out.append({"insertion": f"{names[i]} below {names[i - 1]} ({base} → {cfg.label})", "T_new/T_i": t_new / t_i,
                    "L_new": l_new, "L_i before": l_before, "L_i after": l_after,
                    "rhs L_new(1/L_i − 1/L_i′)": l_new * (1 / l_before - 1 / l_after),
                    "Theorem 3.2 says": "helps" if helps else "hurts", "measured tok/s ratio": ratio,
                    "agrees": "yes" if helps == (ratio > 1) else "NO"})
    return out


def summary_table(rows: list[dict], labels: list[str]) -> list[dict]:
    out = []
    for label in labels:
        rs = [r for r in rows if r["config"] == label]
        drafted = [r for r in rs if r["accept_rate"] == r["accept_rate"]]
        time_total = sum(r["draft_ms"] + r["verify_ms"] + r["overhead_ms"] for r in rs) or 1.0
        positions = [json.loads(r["per_position_accept"]) for r in rs]
        width = max((len(p) for p in positions), default=0)
        timed = any(r["verify_ms"] for r in rs)  # transformers' assisted rows have no phase timers
        out.append({
            "config": label,
            "tok/s (median)": statistics.median(r["tokens_per_s"] for r in rs),
            f"speedup vs {labels[0]} (median)": statistics.median(r["speedup"] for r in rs),
            "mean accepted len": statistics.mean(r["mean_accept_len"] for r in drafted) if drafted else float("nan"),
            "accept rate": statistics.mean(r["accept_rate"] for r in drafted) if drafted else float("nan"),
            "per-position accept": " ".join(f"{statistics.mean(p[i] for p in positions if len(p) > i):.2f}" for i in range(width)),
            "draft/verify/other %": "/".join(f"{100 * sum(r[k] for r in rs) / time_total:.0f}" for k in SPLIT) if timed else "n/a",
            "engine overhead %": 100 * statistics.median(r["engine_overhead_frac"] for r in rs) if timed else float("nan"),
            "same tokens as AR": f"{sum(r['same_tokens_as_ar'] for r in rs)}/{len(rs)}",
        })
    return out


def peer_table(rows: list[dict], configs: list[BenchConfig]) -> list[dict]:
    """Each engine row against its peer: transformers' assisted generation with the same target, draft, γ and dtype,
    or the row its ``extra["peer"]`` names; the per-prompt tok/s ratio (median, min, max)."""
    def pair(c: BenchConfig) -> tuple:
        return c.decode.draft, c.decode.gamma, c.decode.gamma_policy, c.decode.dtype

    pairs = [(cfg.label, peer.label) for peer in configs if peer.hf_assisted
             for cfg in configs if not cfg.hf_assisted and cfg.decode.method == "sd" and pair(cfg) == pair(peer)]
    pairs += [(cfg.label, cfg.extra["peer"]) for cfg in configs if "peer" in cfg.extra]
    tps = {(r["config"], r["prompt_id"]): r["tokens_per_s"] for r in rows}
    out = []
    for row, peer in pairs:
        ratios = [v / tps[(peer, pid)] for (label, pid), v in tps.items() if label == row]
        out.append({"engine row": row, "peer": peer, "engine / peer (median)": statistics.median(ratios),
                    "min": min(ratios), "max": max(ratios), "prompts": len(ratios)})
    return out


def markdown(table: list[dict]) -> str:
    cols = list(table[0])
    fmt = (lambda v: f"{v:.2f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in table]
    return "\n".join(lines)


def write_results(rows: list[dict], configs: list[BenchConfig], out: Path, max_new_tokens: int, machine: str = "",
                  repeats: int = 1) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    labels = [c.label for c in configs]
    categories = sorted({r["category"] for r in rows})
    parts = [f"# Benchmark ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine or platform.machine()}. Greedy, {max_new_tokens} new tokens, "
             f"{len(rows) // len(labels)} prompts, configurations interleaved per prompt (rotated order) after a warm-up"
             + (f"; each row is the fastest of {repeats} interleaved rounds." if repeats > 1 else "."),
             "Speedup = median over prompts of (tok/s of the row) / (tok/s of AR on the same prompt).", "",
             "## Overall", "", markdown(summary_table(rows, labels)), ""]
    if peers := peer_table(rows, configs):
        parts += ["## Rows against their peers", "",
                  "Per-prompt tok/s ratio of each row to its peer: `generate(assistant_model=...)` on the same target, "
                  "draft and γ, or the row named.", "", markdown(peers), ""]
    if all(c.quality for c in configs):
        table = quality_table(rows, labels)
        out.with_suffix(".svg").write_text(speed_quality_svg(table))
        parts += ["## Speed and quality", "", f"Quality on the held-out verifiable questions ({len(rows) // len(labels)}); "
                  "accuracy = the expected answer is the last number (or a whole word) of the output; log-likelihood = the "
                  "target's mean log p per output token. Exact greedy SD is lossless: its outputs are the target's own.", "",
                  markdown(table), "",
                  f"![speed against quality]({out.with_suffix('.svg').name})", ""]
    if any(c.decode.chain for c in configs):
        parts += ["## Theory (Lemma 3.1) against measurement", "",
                  "Predicted tok/s from each run's own per-forward times T_i and acceptance lengths L_i; measured = "
                  "decode tok/s of the same run (prefill excluded on both sides).", "",
                  markdown(theory_table(rows, labels)), "", "## Insertions (Theorem 3.2)", "",
                  markdown(insertion_table(rows, configs)), ""]
    if model := model_table(rows, labels):
        parts += ["## Cost model against measurement", "",
                  "Predicted speedup = E[tokens per step] / (γ·c + T(k)/T(1)) per step (`specviz/analysis/cost_model.py`): "
                  "E from the run's per-depth acceptance, c its draft ms per token, T(k) its verify ms per forward of k "
                  "rows, T(1) the AR run's on the same prompt. Measured = the tok/s ratio above (prefill and engine "
                  "overhead included, which the model leaves out). Error = measured / predicted − 1.", "",
                  markdown(model), ""]
    for cat in categories:
        parts += [f"## {cat}", "", markdown(summary_table([r for r in rows if r["category"] == cat], labels)), ""]
    out.with_suffix(".md").write_text("\n".join(parts))
