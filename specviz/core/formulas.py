"""The speculative-decoding formulas, in one place: expected tokens per step, speedup, the censored-MLE
acceptance estimate and the capped-geometric acceptance length (polybasic Theorem 3.3)."""

from __future__ import annotations

from collections.abc import Callable


def expected_tokens(acc: float, gamma: int) -> float:
    """(1 − α^{γ+1}) / (1 − α): tokens per step with i.i.d. acceptance α, bonus token included."""
    return gamma + 1.0 if acc >= 1 else (1 - acc ** (gamma + 1)) / (1 - acc)


def step_speedup(tokens_per_step: float, draft: float, verify: float) -> float:
    """A step's speedup over AR: the tokens it emits over its cost in one-token target steps, ``draft`` for drafting
    and ``verify`` = T(k)/T(1) for the target's forward over k fed rows."""
    return tokens_per_step / (draft + verify)


def speedup(acc: float, c: float, gamma: int, verify: float = 1.0) -> float:
    """S(γ) = (1 − α^{γ+1}) / ((1 − α)(γc + T(γ+1)/T(1))), with c = draft time per token / T(1) and ``verify`` =
    T(γ+1)/T(1), the verify's cost over γ + 1 rows against a one-token step (1: the classic formula)."""
    return step_speedup(expected_tokens(acc, gamma), gamma * c, verify)


def best_gamma(acc: float, c: float, gamma_max: int, verify: Callable[[int], float] = lambda k: 1.0) -> int:
    """The γ in 0..γ_max with the highest :func:`speedup`, ``verify(k)`` = T(k)/T(1)."""
    return max(range(gamma_max + 1), key=lambda g: speedup(acc, c, g, verify(g + 1)))


def censored_acceptance(accepted: float, rejections: float) -> float | None:
    """Per-token acceptance ΣV / (ΣV + Σ 1[V < γ]): the censored-geometric MLE (a fully accepted draft says
    nothing about the token after it, so the naive ΣV / Σγ is biased low). None without observations."""
    trials = accepted + rejections
    return accepted / trials if trials else None


def capped_geometric_pmf(a: float, m: int) -> list[float]:
    """P(L = l) for l = 1..m: l − 1 acceptances then a rejection, or m − 1 acceptances (the cap)."""
    return [a ** (ell - 1) * (1 - a) for ell in range(1, m)] + [a ** (m - 1)]


def capped_geometric_moments(a: float, m: int) -> tuple[float, float]:
    """(E[L], E[L²]) of an acceptance length capped at m = K + 1 (Theorem 3.3)."""
    if a >= 1:
        return float(m), float(m * m)
    mean = (1 - a ** m) / (1 - a)
    return mean, 2 * (1 - (m + 1) * a ** m + m * a ** (m + 1)) / (1 - a) ** 2 - mean
