"""The estimates behind the online γ policy and draft selection: a drafter's recent steps, their acceptance rate and
draft cost, the target's verify cost, a probe schedule and the predicted tokens per second of each γ."""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specviz.core.formulas import censored_acceptance, expected_tokens
from specviz.core.policy import Outcome
from specviz.core.tree import StopRule, depths


def outcome_of(event) -> Outcome:
    """A recorded step (a :class:`~specviz.core.record.StepEvent`) as the policies saw it, for fits over traces."""
    depth = max(depths(event.tree.parents), default=0) if event.tree else None
    return Outcome(len(event.draft_ids), event.accepted, event.spans["drafting"], event.spans["verifying"],
                   len(event.emitted_ids), event.total_ms - event.spans["recording"], depth, event.drafter)


class History:
    """The last ``h`` steps of one drafter, with the paper's estimates over them."""

    def __init__(self, h: int = 20, acc_max: float = 0.95):
        self.steps: deque[Outcome] = deque(maxlen=h)
        self.costs: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=h))  # drafted count → its last h verify times
        self.recent: deque[tuple[int, float]] = deque(maxlen=h)  # (drafted count, verify ms) of the last h steps
        self.acc_max = acc_max
        self.calibration = Calibration()

    def add(self, rec: Outcome) -> None:
        if rec.drafted:
            self.steps.append(rec)
            self.calibration.add(rec)
        self.costs[rec.drafted].append(rec.verify_ms)
        self.recent.append((rec.drafted, rec.verify_ms))

    def single_paths(self) -> bool:
        """Whether every recent step drafted a single path (a tree's node budget is not its depth)."""
        return all(s.depth in (None, s.drafted) for s in self.steps)

    def drafted(self) -> list[Outcome]:
        return list(self.steps)

    def acceptance(self, prior: float | None = None, weight: float = 0.0) -> float | None:
        """Censored MLE of per-token (for a tree: per-depth) acceptance: ΣV / (ΣV + Σ 1[V < γ]) (their Eq. 2; a tree's
        depth in place of γ), capped at Acc_max;
        ``weight`` pseudo-observations of a ``prior`` rate join both sums (weight 0: the paper's estimate)."""
        accepted, rejections = sum(s.accepted for s in self.steps), sum(s.accepted < s.reach for s in self.steps)
        if prior is not None:
            accepted, rejections = accepted + weight * prior, rejections + weight * (1 - prior)
        acc = censored_acceptance(accepted, rejections)
        return None if acc is None else min(self.acc_max, acc)

    def naive_acceptance(self) -> float | None:
        """ΣV / Σγ: biased low (a rejection hides the tokens after it); kept for comparison."""
        steps = self.drafted()
        return sum(s.accepted for s in steps) / sum(s.drafted for s in steps) if steps else None

    def depth_of(self, gamma: int) -> float:
        """The depth a draft of ``gamma`` tokens reaches: γ for a chain; for a tree, its measured mean depth at that
        budget, else γ times the window's depth per node."""
        steps = self.drafted()
        at = [s.reach for s in steps if s.drafted == gamma]
        if at:
            return sum(at) / len(at)
        total = sum(s.drafted for s in steps)
        return gamma * sum(s.reach for s in steps) / total if total else float(gamma)

    def draft_ms_per_token(self) -> float | None:
        steps = self.drafted()
        return sum(s.draft_ms for s in steps) / sum(s.drafted for s in steps) if steps else None

    def verify_model(self, profile: dict[int, float] | None = None) -> VerifyCost | None:
        """b_p(γ): with the machine's ``profile``, its time at γ times the median, over the last ``h`` steps, of each
        step's verify time over the profile's at that step's γ; else (and past the profile) each γ ever verified (γ = 0:
        a plain step) at the mean of its own last ``h`` verify times, kept apart from the window of ``h`` steps, so that
        a run of steps at one γ does not forget what a longer or a plain step costs. None before any step."""
        measured = {gamma: sum(ms) / len(ms) for gamma, ms in sorted(self.costs.items()) if ms}
        ratios = [ms / profile[gamma] for gamma, ms in self.recent if profile and profile.get(gamma)]
        return VerifyCost(measured, profile or {}, statistics.median(ratios) if ratios else None) if measured else None


class Estimates:
    """A run's estimates: one :class:`History` per drafter and one of the target's verify cost, shared by the γ policy
    and the draft selector, so that both read the same acceptance and costs of a drafter. The acceptance is the
    censored MLE shrunk towards the drafter's prior (the acceptance predicted from its prompt, from ``priors``; else
    ``prior``; None: the plain MLE) by ``prior_weight`` pseudo-observations. ``profile``: the target's verify time per γ
    measured at load (``specviz.models.backends.cpu.verify_profile``; empty: none), the shape of :class:`VerifyCost`.
    Whoever builds the estimates files the steps into them (:meth:`file`): the selector under draft selection, else the
    policy."""

    def __init__(self, h: int = 20, acc_max: float = 0.95, priors: dict[str, float] | None = None,
                 prior: float | None = 0.5, prior_weight: float = 1.0, profile: dict[int, float] | None = None):
        self.histories: dict[str, History] = defaultdict(lambda: History(h, acc_max))
        self.verify = History(h, acc_max)
        self.acc_max, self.priors, self.prior, self.prior_weight = acc_max, priors or {}, prior, prior_weight
        self.profile = profile or {}

    def verify_cost(self) -> VerifyCost | None:
        """The target's verify cost b_p(γ) as measured in this run so far, shaped by the profile (None before any step)."""
        return self.verify.verify_model(self.profile)

    def prior_of(self, name: str) -> float | None:
        return self.priors.get(name, self.prior)

    def acceptance(self, name: str) -> float | None:
        """The drafter's acceptance rate per token (a tree: per depth), capped at Acc_max."""
        return self.histories[name].acceptance(self.prior_of(name), self.prior_weight)

    def file(self, outcome: Outcome) -> None:
        """Record a finished step: the verify cost learns from every step (it does not depend on who drafted, and plain
        steps count), a drafter's own history from the steps it drafted."""
        self.verify.add(outcome)
        if outcome.drafted:
            self.histories[outcome.drafter].add(outcome)


@dataclass(frozen=True)
class VerifyCost:
    """Target milliseconds per step for a verify of γ drafted tokens (γ = 0: a plain step). A γ of the machine's
    ``profile`` (γ → ms measured at load) costs its profile time times ``scale``, the run's measured time over the
    profile's (a median over recent steps); any other γ its ``measured`` mean, else the nearest measured one's (the
    nearest shorter, else the nearest longer).

    Not the paper's line in γ: on a CPU the matrix kernel changes with the number of rows (the offline target verifies
    a few drafted tokens about as cheaply as a plain step, a few more at half as much again), and a line through such a
    staircase prices the γ past a step as dear as the next one and never tries it. The profile gives the staircase's
    shape before the run has taken each γ, and the run its scale: a busy machine is slower at every γ, and one slow step
    (a busy core's scheduler, not the γ) moves a median of every γ's steps little, where it would price its own γ out
    of a per-γ mean until that γ is taken again. Without a profile (a GPU, whose cost rises smoothly), cost never falls
    with γ, so the nearest shorter cost is a lower bound: an optimistic price, which gets tried once and measured. A
    policy reads it up to :meth:`longest_priced` only, so that it learns one γ at a time beyond what the profile
    covers."""

    measured: dict[int, float]
    profile: dict[int, float] = field(default_factory=dict)
    scale: float | None = None

    def __call__(self, gamma: int) -> float:
        if self.scale is not None and gamma in self.profile:
            return self.scale * self.profile[gamma]
        if gamma in self.measured:
            return self.measured[gamma]
        below = [g for g in sorted(self.measured) if g < gamma]
        return self.measured[below[-1] if below else min(g for g in self.measured if g > gamma)]

    def longest_priced(self, gamma_max: int) -> int:
        """The longest γ worth pricing, within ``gamma_max``: every γ of the profile, and one beyond the longest
        measured. Priced optimistically past all it has measured, a policy free to pick any γ would jump to the longest
        and walk back down one slow verify per γ; one γ at a time, each longer draft is tried once before the next is
        priced."""
        return min(gamma_max, max(max(self.measured, default=0) + 1, max(self.profile, default=0)))


class Calibration:
    """How often a drafted token whose draft probability fell in each of ``bins`` equal bins was accepted, over the run
    (a greedy draft's own probability is a good but biased guess of its acceptance: the head's tokens at 0.1–0.2 are
    accepted about twice that often). Each bin starts from ``weight`` pseudo-observations at its midpoint. A step
    teaches it its accepted tokens and the first rejected one; the tokens after a rejection were never tested."""

    def __init__(self, bins: int = 10, weight: float = 2.0):
        self.bins, self.weight = bins, weight
        self.accepted, self.seen = [0.0] * bins, [0.0] * bins

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def __call__(self, confidence: float) -> float:
        """The acceptance of a drafted token with this draft probability."""
        b = self._bin(confidence)
        return (self.accepted[b] + self.weight * (b + 0.5) / self.bins) / (self.seen[b] + self.weight)

    def best(self) -> float:
        """The acceptance of the likeliest bin."""
        return max(self((b + 0.5) / self.bins) for b in range(self.bins))

    def add(self, rec: Outcome) -> None:
        rejected = rec.accepted < rec.drafted and rec.emitted == rec.accepted + 1  # not cut short by a stop token
        for i, confidence in enumerate(rec.confidence[: rec.accepted + rejected]):
            b = self._bin(confidence)
            self.accepted[b] += i < rec.accepted
            self.seen[b] += 1


class ProbeSchedule:
    """When to draft anyway after a run of plain steps, so that a stale estimate can recover: after
    ``base`` plain-looking steps in a row, then twice as many after each probe that did not pay, up to
    ``cap``; a step that drafts on its merits starts over. Backing off keeps probes cheap on text the
    drafts cannot predict."""

    def __init__(self, base: int = 2, cap: int = 64):
        self.base, self.cap = base, cap
        self.run, self.wait = 0, base

    def plain(self) -> bool:
        """One more step that would be plain; True when it should probe instead."""
        self.run += 1
        if self.run < self.wait:
            return False
        self.run, self.wait = 0, min(self.cap, 2 * self.wait)
        return True

    def drafting(self) -> None:
        self.run, self.wait = 0, self.base


def continuation(calibration: Calibration, acc: float, a_q: float, b_p: VerifyCost, rate: float, shortest: int,
                 longest: int) -> tuple[int, StopRule]:
    """A stop rule for a single path (:data:`~specviz.core.tree.StopRule`) and the most it may draft. After each drafted
    token the rule drafts on only if some longer draft is worth more than stopping here, a draft of g tokens being worth
    E[tokens] − rate · (g·a_q + b_p(g)) with ``rate`` the best predicted tokens per millisecond (the gain in tokens of the
    time it takes, at the rate the run can reach). The tokens drafted so far count at their calibrated acceptance
    (:class:`Calibration`), the ones to come at ``acc``. The most is the best length, from ``shortest`` to ``longest``,
    were every token as likely to pass as the likeliest a draft can be (the calibration's best bin, or ``acc``): no
    draft that stops on its own gets past it."""
    def worth(gamma: int, tokens: float) -> float:
        return tokens - rate * (gamma * a_q + b_p(gamma))

    top = max(calibration.best(), acc)
    most = max(range(shortest, longest + 1), key=lambda g: worth(g, expected_tokens(top, g)))

    def stop(path: list[float]) -> bool:
        reach, tokens = 1.0, 1.0
        for confidence in path:
            reach *= calibration(confidence)
            tokens += reach
        here, best = worth(len(path), tokens), -float("inf")
        for gamma in range(len(path) + 1, most + 1):
            reach *= acc
            tokens += reach
            best = max(best, worth(gamma, tokens))
        return best <= here
    return most, stop


def predicted_rates(acc: float, a_q: float, b_p: VerifyCost, gamma_max: int, gamma_min: int = 0,
                    depth: Callable[[int], float] = float) -> dict[int, float]:
    """Tokens per second for each γ (a tree's node budget): expected tokens / (γ·a_q + b_p(γ)) (their Eq. 1), the
    expected tokens of a draft reaching ``depth(γ)``."""
    return {g: 1e3 * expected_tokens(acc, depth(g)) / (g * a_q + b_p(g)) for g in range(gamma_min, gamma_max + 1)}
