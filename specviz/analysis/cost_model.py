"""The cost model of speculative decoding, with the verify's cost measured rather than assumed free.

A step that drafts γ tokens (a chain) or γ nodes (a token tree) feeds k = γ + 1 rows to the target. In units of a
one-token target step T(1), it costs ``γ·c`` drafting (c = draft time per token / T(1)) and ``r(k) = T(k)/T(1)``
verifying, and emits E tokens, so its speedup over AR is ``E / (γ·c + r(k))``
(:func:`specviz.core.formulas.step_speedup`). E comes from the per-depth acceptance: with a_d the probability that
depth d is accepted given that the step drafted it and accepted depth d − 1, a step that reaches depth D emits
``1 + Σ_{d≤D} Π_{j≤d} a_j``; a chain is the tree with one node per depth, and i.i.d. acceptance (a_d = α) gives the
classic ``(1 − α^{γ+1})/(1 − α)``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from specviz.core.formulas import censored_acceptance, step_speedup
from specviz.core.tree import depths
from specviz.models.paths import ASSETS

PROFILE = ASSETS / "verify_cost.json"


@dataclass(frozen=True)
class VerifyCost:
    """r(k) = T(k)/T(1) at measured row counts k; between them linear, beyond the last along the last segment."""

    points: dict[int, float]
    source: str = ""

    def __call__(self, k: int) -> float:
        knots = sorted({1: 1.0, **self.points}.items())
        if k <= 1:
            return 1.0
        for (k0, r0), (k1, r1) in zip(knots, knots[1:]):
            if k <= k1:
                return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
        (k0, r0), (k1, r1) = knots[-2:] if len(knots) > 1 else ((0, 1.0), knots[-1])
        return r1 + max(0.0, (r1 - r0) / (k1 - k0)) * (k - k1)

    @classmethod
    def load(cls, path: Path = PROFILE) -> VerifyCost:
        """The committed profile of the reference CPU (``scripts/verify_cost_profile.py`` writes it)."""
        data = json.loads(path.read_text())
        return cls({int(k): float(r) for k, r in data["ratios"].items()}, data["source"])


FREE = VerifyCost({}, "free: T(k) = T(1)")
"""The classic model's assumption, that verifying k rows costs one token's step."""


@dataclass(frozen=True)
class StepShape:
    """What the cost model reads of one step: rows fed, depth drafted, tokens accepted, and its two costs (ms)."""

    rows: int
    depth: int
    accepted: int
    draft_ms: float
    verify_ms: float

    @classmethod
    def of(cls, e) -> StepShape:
        """From a :class:`~specviz.core.record.StepEvent` or its dict (a trace's step)."""
        get = e.get if isinstance(e, Mapping) else (lambda key: getattr(e, key))
        tree, drafted = get("tree"), len(get("draft_ids"))
        if tree is None:
            depth = drafted
        elif isinstance(tree, Mapping):
            depth = max((n["depth"] for n in tree["nodes"]), default=0)
        else:
            depth = max(depths(tree.parents), default=0)
        spans = get("spans")
        return cls(drafted + 1, depth, get("accepted"), spans["drafting"], spans["verifying"])


def per_depth_acceptance(steps: Sequence[StepShape]) -> list[float]:
    """a_d, d = 1 … the deepest draft: of the steps that drafted depth d and accepted depth d − 1, the share that
    accepted depth d."""
    out = []
    for d in range(1, max((s.depth for s in steps), default=0) + 1):
        tried = [s for s in steps if s.depth >= d and s.accepted >= d - 1]
        out.append(sum(s.accepted >= d for s in tried) / len(tried) if tried else 0.0)
    return out


def expected_tokens_by_depth(a: Sequence[float], depth: int) -> float:
    """1 + Σ_{d≤depth} Π_{j≤d} a_j: the tokens a step that drafts ``depth`` deep emits on average."""
    total, reach = 1.0, 1.0
    for ad in a[:depth]:
        reach *= ad
        total += reach
    return total


def measured_ratios(steps: Iterable[StepShape], t1_ms: float) -> dict[int, float]:
    """The run's own r(k): mean verify ms of its steps that fed k rows, over T(1)."""
    by_rows: dict[int, list[float]] = {}
    for s in steps:
        by_rows.setdefault(s.rows, []).append(s.verify_ms)
    return {k: statistics.mean(v) / t1_ms for k, v in sorted(by_rows.items())}


def predict_run(events: Sequence, t1_ms: float | None, profile: VerifyCost | None = None) -> dict | None:
    """The cost model's prediction for a speculative run: tokens per step from its per-depth acceptance, the draft cost
    c, and the verify cost r(k) measured in the run against ``t1_ms``, the AR baseline's ms per step. Without a
    baseline, r(k) comes from ``profile`` and T(1) is inferred from it. Also the run's i.i.d. acceptance α (the
    censored MLE: accepted ÷ (accepted + rejections)). None for a run that never drafted."""
    steps = [StepShape.of(e) for e in events]
    if not any(s.rows > 1 for s in steps):
        return None
    profile = profile or VerifyCost.load()
    if not t1_ms:
        ratios, source = {k: profile(k) for k in {s.rows for s in steps}}, profile.source
        t1_ms = statistics.mean(s.verify_ms / profile(s.rows) for s in steps)
    else:
        ratios, source = measured_ratios(steps, t1_ms), "this run against its AR baseline"
    a = per_depth_acceptance(steps)
    c = sum(s.draft_ms for s in steps) / sum(s.rows - 1 for s in steps) / t1_ms
    tokens = sum(expected_tokens_by_depth(a, s.depth) for s in steps)
    drafting, verifying = sum(s.rows - 1 for s in steps) * c, sum(ratios[s.rows] for s in steps)
    alpha = censored_acceptance(sum(s.accepted for s in steps), sum(s.accepted < s.depth for s in steps))
    return {"per_depth_acceptance": a, "alpha": alpha or 0.0, "c": c, "t1_ms": t1_ms, "verify_ratio": ratios, "verify_source": source,
            "tokens_per_step": tokens / len(steps), "mean_rows": statistics.mean(s.rows for s in steps),
            "predicted_speedup": step_speedup(tokens, drafting, verifying)}


def t1_of(ar_metrics: Mapping | None) -> float | None:
    """T(1), the AR baseline's ms per target forward, from its metrics (None without a baseline)."""
    return ar_metrics["verify_ms"] / ar_metrics["target_forwards"] if ar_metrics and ar_metrics.get("target_forwards") else None


def by_gamma(events: Sequence, t1_ms: float | None, profile: VerifyCost | None = None) -> list[dict]:
    """What each γ = 1 … the run's deepest draft would give at the run's measured per-depth acceptance: the tokens per
    step, and where the run timed its steps (a server's steps are not timed) and drafted single paths, the speedup
    ``E / (γ·c + r(γ + 1))`` with the run's c and its own r(k) where it fed k rows (the profile's elsewhere)."""
    steps = [StepShape.of(e) for e in events]
    a = per_depth_acceptance(steps)
    timed = any(s.verify_ms > 0 for s in steps) and all(s.rows - 1 == s.depth for s in steps)
    prediction = predict_run(events, t1_ms, profile) if timed else None
    profile = profile or VerifyCost.load()
    out = []
    for gamma in range(1, len(a) + 1):
        tokens = expected_tokens_by_depth(a, gamma)
        speed = None
        if prediction is not None:
            ratio = prediction["verify_ratio"].get(gamma + 1, profile(gamma + 1))
            speed = step_speedup(tokens, gamma * prediction["c"], ratio)
        out.append({"gamma": gamma, "tokens_per_step": tokens, "speedup": speed})
    return out


def profile_from_bench(rows: Sequence[Mapping], source: str) -> VerifyCost:
    """r(k) from a benchmark CSV whose rows fix the fed rows (labels ending "(k rows)"): per k, the median over rows and
    prompts of the target's ms per forward over AR's on the same prompt."""
    ar = {r["prompt_id"]: json.loads(r["levels"])[0]["T_ms"] for r in rows if r["config"] == "ar"}
    by_k: dict[int, list[float]] = {}
    for r in rows:
        label = r["config"]
        if label.endswith(" rows)"):
            k = int(label.rsplit("(", 1)[1].split()[0])
            by_k.setdefault(k, []).append(json.loads(r["levels"])[0]["T_ms"] / ar[r["prompt_id"]])
    return VerifyCost({k: round(statistics.median(v), 4) for k, v in sorted(by_k.items())}, source)
