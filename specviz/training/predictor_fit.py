"""Fitting the offline-light acceptance predictor on the warm-up prompts (least squares per draft)."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from specviz.analysis.suites import load_warmup
from specviz.methods.estimation import History, outcome_of
from specviz.methods.predictor import AcceptancePredictor, prompt_features
from specviz.models.presets import NGRAM_DRAFT, OFFLINE_PRESET, PRESETS
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare


def fit_predictor(n_prompts: int, out: Path, max_new_tokens: int = 48, gamma: int = 4) -> AcceptancePredictor:
    """Fit the prompt-feature acceptance predictor on the warm-up prompts (``n_prompts`` of them, all when 0)
    and save it to ``out`` (the bundled one is ``PREDICTOR_FILE``). They are hand-written like the suites, not drawn from the distillation
    recipe: on the recipe's own kind of instruction the drafts look better than on new text."""
    bank = ModelBank()
    prompts = [item["prompt"] for item in load_warmup(n_prompts)]
    names = [*PRESETS[OFFLINE_PRESET].drafts, NGRAM_DRAFT]
    weights, meta = {}, {"prompts": len(prompts), "gamma": gamma, "max_new_tokens": max_new_tokens, "fit": {}}
    for name in names:
        features, acceptance = [], []
        for prompt in prompts:
            config = DecodeConfig(method="sd", draft=name, gamma=gamma, gamma_policy="fixed", max_new_tokens=max_new_tokens)
            run = prepare(config, prompt, bank)
            hist = History(h=10_000, acc_max=0.99)
            for event in run.events():
                hist.add(outcome_of(event))
            features.append(prompt_features(run.prompt_ids, run.drafters[0]))
            acceptance.append(hist.acceptance() or 0.0)
        weights[name] = fit_weights(features, acceptance)
        predicted = [sum(a * b for a, b in zip(weights[name], f)) for f in features]
        meta["fit"][name] = {"mean_acceptance": statistics.mean(acceptance),
                             "mean_abs_error": statistics.mean(abs(p - a) for p, a in zip(predicted, acceptance))}
        print(f"{name}: {meta['fit'][name]}", flush=True)
    predictor = AcceptancePredictor(weights, meta)
    predictor.save(out)
    return predictor


def fit_weights(features: list[list[float]], acceptance: list[float]) -> list[float]:
    """Least squares (with a small ridge so a constant feature cannot make it singular)."""
    x, y = torch.tensor(features, dtype=torch.float64), torch.tensor(acceptance, dtype=torch.float64)
    ridge = 1e-3 * torch.eye(x.shape[1], dtype=torch.float64)
    return torch.linalg.solve(x.T @ x + ridge, x.T @ y).tolist()
