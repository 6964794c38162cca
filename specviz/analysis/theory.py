"""The polybasic paper's theory, computed from what a run measured.

- Lemma 3.1: time for N tokens, ``T = Σ_{i<n} (N/L_i)·T_i + β·(N/L_{n−1})·T_n``.
- Theorem 3.2: inserting M_new below M_i helps iff ``T_new/T_i < L_new·(1/L_i − 1/L_i′)``.
- Theorem 3.3: an acceptance length is capped-geometric; with per-token acceptance a and cap m = K + 1,
  ``E[L] = (1 − a^m)/(1 − a)`` and ``E[L²] = 2(1 − (m+1)a^m + m·a^{m+1})/(1 − a)² − E[L]``.

Levels are listed top first: level 1 is the target, the last level drafts. ``T_i`` is the mean
duration of one forward of level i in this run; ``L_i`` the mean number of tokens level i passes up
per verification; β the drafting level's passes per verification of the level above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specviz.core.formulas import capped_geometric_moments, capped_geometric_pmf, censored_acceptance


def acceptance_mle(verifications: Sequence[Sequence[int]]) -> float | None:
    """Per-token acceptance from (drafted, passed up) pairs: accepted / (accepted + rejections), the
    censored-geometric MLE (a fully accepted draft says nothing about the token after it)."""
    return censored_acceptance(sum(up - 1 for k, up in verifications if k > 0), sum(up - 1 < k for k, up in verifications if k > 0))


def lemma_time(n_tokens: int, t: Sequence[float], lengths: Sequence[float], beta: float) -> float:
    """Lemma 3.1 with t = (T_1..T_n), lengths = (L_1..L_{n−1}); one level (AR) is N·T_1."""
    if len(t) == 1:
        return n_tokens * t[0]
    verify = sum(n_tokens / ell * ti for ti, ell in zip(t[:-1], lengths))
    return verify + beta * n_tokens / lengths[-1] * t[-1]


def insertion_helps(t_new: float, t_i: float, l_new: float, l_i: float, l_i_after: float) -> bool:
    """Theorem 3.2's test for inserting M_new right below M_i."""
    return t_new / t_i < l_new * (1 / l_i - 1 / l_i_after)


def break_even_length(t_new: float, t_i: float, l_new: float, l_i_after: float) -> float:
    """The L_i (M_i's acceptance length without M_new) below which Theorem 3.2 says the insertion helps."""
    return 1 / (t_new / (t_i * l_new) + 1 / l_i_after)


@dataclass
class Level:
    """One model's measured work over a run."""

    name: str
    role: str
    passes: int = 0
    ms: float = 0.0
    verifications: list[list[int]] = field(default_factory=list)

    @property
    def t_ms(self) -> float:
        return self.ms / self.passes if self.passes else 0.0

    @property
    def length(self) -> float:
        return sum(up for _, up in self.verifications) / len(self.verifications) if self.verifications else 0.0

    def acceptance_report(self) -> dict:
        """Theorem 3.3 against the measured lengths, each verification with its own cap m = K + 1."""
        a = acceptance_mle(self.verifications)
        if a is None:
            return {"a": None}
        caps = [k + 1 for k, _ in self.verifications]
        moments = [capped_geometric_moments(a, m) for m in caps]
        m_max = max(caps)
        predicted = [0.0] * m_max
        for m in caps:
            for i, prob in enumerate(capped_geometric_pmf(a, m)):
                predicted[i] += prob / len(caps)
        measured = [0.0] * m_max
        for _, up in self.verifications:
            measured[min(up, m_max) - 1] += 1 / len(self.verifications)
        return {
            "a": a, "mean_cap": sum(caps) / len(caps),
            "mean_predicted": sum(x for x, _ in moments) / len(moments), "mean_measured": self.length,
            "second_moment_predicted": sum(y for _, y in moments) / len(moments),
            "second_moment_measured": sum(up * up for _, up in self.verifications) / len(self.verifications),
            "pmf_predicted": predicted, "pmf_measured": measured,
        }


def levels_of(events: Sequence) -> list[Level] | None:
    """Target first, then each drafter level, summed over the run; None when drafters changed mid-run."""
    if len({e.drafter for e in events if e.draft_ids}) > 1:
        return None
    target = Level("target", "verify", len(events), sum(e.spans["verifying"] for e in events),
                   [[len(e.draft_ids), e.accepted + 1] for e in events])
    below: list[Level] = []
    for e in events:
        for i, rec in enumerate(e.levels):
            if i == len(below):
                below.append(Level(rec.name, rec.role))
            below[i].passes += rec.passes
            below[i].ms += rec.ms
            below[i].verifications += rec.verifications
    return [target, *below]


THEORY_KEYS = {
    "levels": "one object per level, target first: `name`, `role` (`verify` or `draft`), `T_ms` (mean forward time), "
              "`passes`, and `L` with `predicted_passes` for a verifying level or `beta` (drafting passes per verification) "
              "for the drafting level",
    "tokens": "tokens the run emitted",
    "predicted_tokens_per_s": "Lemma 3.1's tokens/s from the run's own T_i and L_i",
    "measured_tokens_per_s": "the decode's tokens/s (prefill excluded on both sides)",
    "predicted_over_measured": "measured over predicted decode time",
    "acceptance": "per verifying level, Theorem 3.3: the censored-MLE acceptance `a`, `mean_cap`, `mean_predicted` and "
                  "`mean_measured`, `second_moment_predicted` and `second_moment_measured`, `pmf_predicted` and `pmf_measured`",
    "insertions": "per intermediate level, Theorem 3.2: `inserted`, `below`, `T_new/T_i`, `L_new`, `L_i_after` and "
                  "`L_i_break_even` (the acceptance length of the level above without this one, below which the insertion "
                  "helps); with a reference run also `L_i_before` and `predicted_helps`",
}
"""What each key of :func:`run_theory`'s block holds (the docs render it)."""


def run_theory(events: Sequence, reference_lengths: dict[str, float] | None = None) -> dict | None:
    """The ``theory`` block of a run: per-level T_i and L_i, Lemma 3.1's predicted against the measured
    decode tokens/s (prefill excluded on both sides), Theorem 3.3 per verifying level, and Theorem 3.2
    for every intermediate level. ``reference_lengths`` maps an intermediate level's name to the acceptance
    length of the level above it measured without it (another run); without one, Theorem 3.2's verdict
    is given as a break-even length."""
    levels = levels_of(events)
    if not levels or not events:
        return None
    n_tokens = sum(len(e.emitted_ids) for e in events)
    verifying = [lv for lv in levels if lv.role == "verify"]
    drafting = levels[-1] if len(levels) > 1 else None
    t = [lv.t_ms for lv in levels] if drafting else [levels[0].t_ms]
    lengths = [n_tokens / len(events)] + [lv.length for lv in verifying[1:]]
    beta = drafting.passes / max(1, len(verifying[-1].verifications)) if drafting else 0.0
    predicted_ms = lemma_time(n_tokens, t, lengths, beta)
    measured_ms = sum(e.total_ms for e in events)
    return {
        "levels": [{"name": lv.name, "role": lv.role, "T_ms": lv.t_ms, "passes": lv.passes,
                    **({"L": ell, "predicted_passes": n_tokens / ell} if lv.role == "verify" else {"beta": beta})}
                   for lv, ell in zip(levels, [*lengths, None])],
        "tokens": n_tokens,
        "predicted_tokens_per_s": 1e3 * n_tokens / predicted_ms if predicted_ms else None,
        "measured_tokens_per_s": 1e3 * n_tokens / measured_ms if measured_ms else None,
        "predicted_over_measured": measured_ms / predicted_ms if predicted_ms else None,
        "acceptance": {lv.name: lv.acceptance_report() for lv in verifying},
        "insertions": [insertion_report(levels, i, lengths, reference_lengths) for i in range(1, len(verifying))],
    }


def insertion_report(levels: list[Level], i: int, lengths: list[float], reference: dict[str, float] | None) -> dict:
    """Theorem 3.2 for verifying level i (an intermediate), read as inserted right below level i − 1.
    ``reference`` holds level i − 1's acceptance length measured without level i, keyed by level i's name."""
    new, above = levels[i], levels[i - 1]
    t_ratio = new.t_ms / above.t_ms if above.t_ms else float("inf")
    report = {"inserted": new.name, "below": above.name, "T_new/T_i": t_ratio, "L_new": lengths[i],
              "L_i_after": lengths[i - 1],
              "L_i_break_even": break_even_length(new.t_ms, above.t_ms, lengths[i], lengths[i - 1]) if above.t_ms else None}
    before = (reference or {}).get(new.name)
    if before is not None:
        report["L_i_before"] = before
        report["predicted_helps"] = insertion_helps(new.t_ms, above.t_ms, lengths[i], before, lengths[i - 1])
    return report

