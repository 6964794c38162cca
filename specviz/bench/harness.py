"""Interleaved benchmark: every configuration runs on the same prompt back to back (order rotated per
prompt) after a warm-up, and speed is reported as the median of per-prompt ratios to AR."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specviz.analysis.cost_model import predict_run
from specviz.analysis.quality import is_correct, target_logprob
from specviz.analysis.suites import load_suite
from specviz.analysis.theory import run_theory
from specviz.bench.configs import CONFIG_SETS, BenchConfig
from specviz.bench.report import theory_columns, write_results
from specviz.core.metrics import summarize
from specviz.core.sampling import Sampler
from specviz.core.timing import Stopwatch
from specviz.models.backends.cpu import is_packed, stock_linears
from specviz.models.loading import describe_hardware
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare


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
def hf_generate(target: torch.nn.Module, draft: torch.nn.Module | None, prompt_ids: list[int], gamma: int,
                max_new_tokens: int, stop_ids: list[int], sampler: Sampler | None = None,
                stop: threading.Event | None = None) -> tuple[list[int], float]:
    """transformers' own ``generate``, assisted by ``draft`` at a constant γ (set on the assistant's generation_config)
    unless it is None: the new ids and the wall seconds, measured after the GPU (if any) has finished. Greedy unless
    ``sampler`` samples (its temperature, top-p and seed; no top-k, as specviz samples). Once ``stop`` is set, it ends
    after the current token (the app's Stop)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Stopped(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs: Any) -> torch.Tensor:
            return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

    assisted: dict = {"stopping_criteria": StoppingCriteriaList([Stopped()])} if stop is not None else {}
    if draft is not None:
        gc = draft.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = gamma, "constant", 0.0
        assisted["assistant_model"] = draft
    sampling: dict = {"do_sample": False}
    if sampler is not None and not sampler.greedy:
        torch.manual_seed(sampler.seed)
        sampling = {"do_sample": True, "temperature": sampler.temperature, "top_p": sampler.top_p, "top_k": 0}
    ids = torch.tensor([prompt_ids], device=target.device)
    watch = Stopwatch(target.device)
    start = watch.mark()
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          eos_token_id=stop_ids or None, pad_token_id=(stop_ids or [0])[0], **sampling, **assisted)
    return out[0, ids.shape[1]:].tolist(), watch.seconds(start, watch.mark())


GENERATE_KERNELS = "transformers' stock nn.Linear kernels"
"""The kernels :func:`time_generate` runs on, in words."""
GENERATE_WARMUP_TOKENS = 2
"""The tokens of the untimed ``generate`` the app and the API run before a timed one."""


def time_generate(config: DecodeConfig, prompt: str, bank: ModelBank, warmup_tokens: int = 0, stop: threading.Event | None = None,
                  **models: Any) -> dict:
    """transformers' ``generate`` on the target (and the draft and γ) of ``config``, with its sampling settings and
    transformers' own linear kernels (:func:`~specviz.models.backends.cpu.stock_linears`), as a user of transformers
    runs it: new tokens, wall seconds, tokens/s and the token ids. ``warmup_tokens``: an untimed ``generate`` of that
    many tokens first (the first call in a process pays set-up costs); ``stop``: see :func:`hf_generate`; ``models``:
    ``prepare``'s model arguments."""
    if warmup_tokens:
        time_generate(replace(config, max_new_tokens=warmup_tokens).validate(), prompt, bank, stop=stop, **models)
    run = prepare(config, prompt, bank, **models)
    draft = run.drafters[0].model.lm.model if run.drafters else None
    with stock_linears(run.target.lm.model, *([draft] if draft is not None else [])):
        new, wall = hf_generate(run.target.lm.model, draft, run.prompt_ids, config.gamma, config.max_new_tokens, run.stop_ids,
                                run.sampler, stop)
    return {"new_tokens": len(new), "wall_s": wall, "tokens_per_s": len(new) / wall, "token_ids": new}


def generate_figure(timing: dict, ar_token_ids: list[int], sampled: bool) -> dict:
    """What the app and a trace keep of a :func:`time_generate` beside its AR baseline: the numbers, whether the
    tokens equal AR's (None when ``sampled``: two draws are not comparable token for token) and the kernels."""
    return {"tokens_per_s": timing["tokens_per_s"], "wall_s": timing["wall_s"], "new_tokens": timing["new_tokens"],
            "same_tokens_as_ar": None if sampled else timing["token_ids"] == ar_token_ids, "kernels": GENERATE_KERNELS}


def run_transformers(cfg: BenchConfig, prompt: str, bank: ModelBank) -> dict:
    """A peer row: :func:`time_generate` of ``cfg``'s decode settings."""
    return time_generate(cfg.decode, prompt, bank)


def run_one(cfg: BenchConfig, prompt: str, bank: ModelBank) -> dict:
    return (run_transformers if cfg.transformers else run_engine)(cfg, prompt, bank)


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


def model_speedup(run: dict, ar: dict) -> float:
    """The cost model's predicted speedup of ``run`` (:func:`specviz.analysis.cost_model.predict_run`), its verify cost
    measured against the AR run on the same prompt; NaN for a run that never drafted."""
    t1 = ar["verify_ms"] / ar["target_forwards"] if ar.get("target_forwards") else None
    prediction = predict_run(run.get("events") or [], t1)
    return prediction["predicted_speedup"] if prediction else float("nan")
