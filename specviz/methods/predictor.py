"""The paper's offline-light draft selection: a linear model from prompt features (length, perplexity
under the draft, a lexical repetition feature) to each draft's acceptance, fitted by least squares on
warm-up prompts and saved next to the drafts. Its predictions are the selector's priors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from specviz.core.cache import CachedModel
from specviz.core.drafters import Drafter
from specviz.models.paths import ASSETS

PREDICTOR_FILE = ASSETS / "models" / "acceptance_predictor.json"
FEATURES = ("bias", "log_length", "draft_log_ppl", "repeat_fraction")


def repeat_fraction(ids: list[int]) -> float:
    """Share of the prompt's bigrams that occur more than once (copyable structure)."""
    bigrams = list(zip(ids, ids[1:]))
    if not bigrams:
        return 0.0
    counts: dict[tuple[int, int], int] = {}
    for b in bigrams:
        counts[b] = counts.get(b, 0) + 1
    return sum(c for c in counts.values() if c > 1) / len(bigrams)


@torch.inference_mode()
def draft_log_perplexity(model: CachedModel, ids: list[int]) -> float:
    """Mean negative log-likelihood of the prompt under the draft (one forward, no cache kept)."""
    x = torch.tensor([ids], device=model.lm.device)
    logits = model.lm.model(input_ids=x).logits[0, :-1, : model.vocab_size].float()
    return float(torch.nn.functional.cross_entropy(logits, x[0, 1:]))


def prompt_features(ids: list[int], drafter: Drafter) -> list[float]:
    """:data:`FEATURES` of a prompt for ``drafter``. A feature head has no perplexity of its own before the
    target has run, so its perplexity feature is 0 and its fit uses the other features."""
    model = next((m for m in drafter.models[:1] if isinstance(m, CachedModel)), None)
    ppl = draft_log_perplexity(model, ids) if model is not None and len(ids) > 1 else 0.0
    return [1.0, math.log(len(ids)), ppl, repeat_fraction(ids)]




class AcceptancePredictor:
    """Per-draft linear weights over :data:`FEATURES`; predictions clipped to [0.01, 0.99]."""

    def __init__(self, weights: dict[str, list[float]], meta: dict | None = None):
        self.weights, self.meta = weights, meta or {}

    def predict(self, drafter: Drafter, ids: list[int]) -> float | None:
        w = self.weights.get(drafter.name)
        if w is None:
            return None
        value = sum(a * b for a, b in zip(w, prompt_features(ids, drafter)))
        return min(0.99, max(0.01, value))

    def priors(self, drafters: list[Drafter], ids: list[int]) -> dict[str, float]:
        return {d.name: p for d in drafters if (p := self.predict(d, ids)) is not None}

    def save(self, path: Path = PREDICTOR_FILE) -> None:
        path.write_text(json.dumps({"features": FEATURES, "weights": self.weights, "meta": self.meta}, indent=1))

    @classmethod
    def load(cls, path: Path = PREDICTOR_FILE) -> AcceptancePredictor | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(data["weights"], data.get("meta"))
