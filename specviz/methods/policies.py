"""Length policies (how many tokens to draft this step) and draft selectors (which drafter drafts).

A policy sees finished steps through ``observe`` and answers ``choose`` before each step; ``explain``
returns why it chose, and the engine attaches that to the step for the UI. Defaults (documented in the
README): history h = 20 steps, Acc_max = 0.95, one pseudo-observation at 0.5 in ``online``'s estimate,
γ ∈ [1, ``MAX_GAMMA``] (0 allowed for ``online``), first probe after 2 plain steps, backing off to 64 (a draft whose first
step was rejected looks useless on that one step; waiting 8 steps cost an eighth of a 64-token answer).
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specviz.core.drafters import Drafter, lookup_continuation
from specviz.core.formulas import censored_acceptance, expected_tokens
from specviz.core.policy import MAX_GAMMA, LengthPolicy
from specviz.core.registry import GAMMA_POLICIES
from specviz.core.tree import depths


@dataclass
class StepRecord:
    """One step as the policies see it; ``depth``: a token tree's depth (None: a chain, as deep as its γ)."""

    gamma: int
    accepted: int
    draft_ms: float
    verify_ms: float
    emitted: int
    total_ms: float
    depth: int | None = None

    @property
    def reach(self) -> int:
        """The most drafts the step could have accepted."""
        return self.gamma if self.depth is None else self.depth


def record_of(event) -> StepRecord:
    depth = max(depths(event.tree.parents), default=0) if event.tree else None
    return StepRecord(len(event.draft_ids), event.accepted, event.draft_ms, event.verify_ms, len(event.emitted_ids), event.total_ms, depth)


def file_step(event, histories: dict[str, History], verify: History) -> None:
    """Record a finished step: ``verify`` times the target on every step (its cost does not depend on who
    drafted, and plain steps count), a drafter's own history gets the steps it drafted."""
    rec = record_of(event)
    verify.add(rec)
    if event.draft_ids:
        histories[event.drafter].add(rec)


class History:
    """The last ``h`` steps of one drafter, with the paper's estimates over them."""

    def __init__(self, h: int = 20, acc_max: float = 0.95):
        self.steps: deque[StepRecord] = deque(maxlen=h)
        self.plain: deque[float] = deque(maxlen=h)
        self.acc_max = acc_max

    def add(self, rec: StepRecord) -> None:
        if rec.gamma:
            self.steps.append(rec)
        else:
            self.plain.append(rec.verify_ms)

    def drafted(self) -> list[StepRecord]:
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
        return sum(s.accepted for s in steps) / sum(s.gamma for s in steps) if steps else None

    def depth_of(self, gamma: int) -> float:
        """The depth a draft of ``gamma`` tokens reaches: γ for a chain; for a tree, its measured mean depth at that
        budget, else γ times the window's depth per node."""
        steps = self.drafted()
        at = [s.reach for s in steps if s.gamma == gamma]
        if at:
            return sum(at) / len(at)
        total = sum(s.gamma for s in steps)
        return gamma * sum(s.reach for s in steps) / total if total else float(gamma)

    def draft_ms_per_token(self) -> float | None:
        steps = self.drafted()
        return sum(s.draft_ms for s in steps) / sum(s.gamma for s in steps) if steps else None

    def verify_model(self) -> VerifyCost | None:
        """b_p(γ): plain steps (γ = 0) timed on their own; each γ the window has drafted at, its mean verify
        time; other γ from a line fitted through the drafted steps.

        Verify cost is not a line in γ on every machine: on a CPU the matrix kernel changes with the number
        of tokens (the offline target verifies up to 4 tokens on one about as cheap as a plain step, and 5 or
        more on one that costs half as much again), so a γ once measured keeps its own cost. Plain steps are
        kept apart from the window of ``h`` steps, so a run of drafted steps does not forget what a plain step
        costs."""
        steps = self.drafted()
        if not steps:
            plain = self.plain_ms()
            return None if plain is None else VerifyCost(plain, plain, 0.0)
        g = [float(s.gamma) for s in steps]
        t = [float(s.verify_ms) for s in steps]
        g_mean, t_mean = sum(g) / len(g), sum(t) / len(t)
        spread = sum((x - g_mean) ** 2 for x in g)
        slope = max(0.0, sum((x - g_mean) * (y - t_mean) for x, y in zip(g, t)) / spread) if spread else 0.0
        by_gamma: dict[int, list[float]] = defaultdict(list)
        for s in steps:
            by_gamma[s.gamma].append(s.verify_ms)
        measured = {gamma: sum(ms) / len(ms) for gamma, ms in sorted(by_gamma.items())}
        return VerifyCost(self.plain_ms(), t_mean - slope * g_mean, slope, measured)

    def plain_ms(self) -> float | None:
        return sum(self.plain) / len(self.plain) if self.plain else None


@dataclass(frozen=True)
class VerifyCost:
    """Target milliseconds per step: ``plain`` for a step with nothing drafted (None: not measured yet,
    then the drafted line is extrapolated); for a verify of γ drafted tokens, the ``measured`` mean at that γ
    if there is one. An unmeasured γ below the longest measured one costs what the nearest shorter measured
    verify (or the plain step) costs: cost never falls with γ, so that is a lower bound, and an optimistic one
    gets tried and measured, where a line through a kernel step would price it out for good. Beyond the
    longest measured γ, ``intercept + slope·γ``, and no less than that longest one."""

    plain: float | None
    intercept: float
    slope: float
    measured: dict[int, float] = field(default_factory=dict)

    def __call__(self, gamma: int) -> float:
        if gamma == 0 and self.plain is not None:
            return self.plain
        if gamma in self.measured:
            return self.measured[gamma]
        known = sorted(self.measured.items()) if self.plain is None else [(0, self.plain), *sorted(self.measured.items())]
        below, above = [c for g, c in known if g < gamma], [c for g, c in known if g > gamma]
        if below and above:
            return below[-1]
        line = self.intercept + self.slope * gamma
        return max(line, below[-1]) if below else min([line, *above])


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




def predicted_rates(acc: float, a_q: float, b_p: VerifyCost, gamma_max: int, gamma_min: int = 0,
                    depth: Callable[[int], float] = float) -> dict[int, float]:
    """Tokens per second for each γ (a tree's node budget): expected tokens / (γ·a_q + b_p(γ)) (their Eq. 1), the
    expected tokens of a draft reaching ``depth(γ)``."""
    return {g: 1e3 * expected_tokens(acc, depth(g)) / (g * a_q + b_p(g)) for g in range(gamma_min, gamma_max + 1)}




@GAMMA_POLICIES.register("+1 after a fully accepted step, −1 after a rejection.", ("gamma",))
class FSMPolicy(LengthPolicy):
    """+``up`` after a fully accepted step, −``down`` after a rejection, within [γ_min, γ_max]."""

    name = "fsm"
    up, down = 1, 1

    def __init__(self, gamma: int = 4, gamma_min: int = 1, gamma_max: int = MAX_GAMMA):
        super().__init__(gamma)
        self.gamma_min, self.gamma_max = gamma_min, gamma_max

    def observe(self, event) -> None:
        if not event.draft_ids:
            return
        step = self.up if event.accepted == len(event.draft_ids) else -self.down
        self.gamma = max(self.gamma_min, min(self.gamma_max, self.gamma + step))


@GAMMA_POLICIES.register("transformers' heuristic schedule: +2 after a full accept, −1 otherwise.", ("gamma",))
class HFHeuristicPolicy(FSMPolicy):
    """transformers' ``"heuristic"`` schedule: +2 on a full accept, −1 otherwise, within [1, ``MAX_GAMMA``]."""

    name = "hf-heuristic"
    up, down = 2, 1

    def __init__(self, gamma: int = 4, gamma_max: int = MAX_GAMMA):
        super().__init__(gamma, 1, gamma_max)


@GAMMA_POLICIES.register("FSM, jumping to a long γ when the current suffix occurred before (copying).", ("gamma",))
class CacheFSMPolicy(FSMPolicy):
    """FSM, plus a jump to a long γ when the current suffix already occurred in prompt + output
    (the copy regime: code edits, QA over the prompt)."""

    name = "cache-fsm"

    def __init__(self, gamma: int = 4, long_gamma: int = MAX_GAMMA, ngram: int = 3, **kw):
        super().__init__(gamma, **kw)
        self.long_gamma, self.ngram, self.hit = long_gamma, ngram, False

    def choose(self, drafter: Drafter, tokens: list[int]) -> int:
        self.hit = bool(lookup_continuation(tokens, 1, self.ngram, self.ngram))
        return self.long_gamma if self.hit else self.gamma

    def explain(self) -> dict:
        return {"policy": self.name, "gamma": self.long_gamma if self.hit else self.gamma, "suffix_seen_before": self.hit}


@GAMMA_POLICIES.register("transformers' confidence stop: draft until the draft's top probability < 0.4.")
class ConfidencePolicy(LengthPolicy):
    """transformers' ``assistant_confidence_threshold``: draft up to γ_max, stop as soon as the draft's
    own top probability falls below the threshold (default 0.4)."""

    name = "confidence"

    def __init__(self, gamma: int = MAX_GAMMA, threshold: float = 0.4):
        super().__init__(gamma)
        self.threshold = threshold
        self.stop_rule = lambda q: float(q.max()) < self.threshold

    @classmethod
    def from_gamma(cls, gamma: int) -> ConfidencePolicy:
        """Its γ is a maximum, γ_max, whatever the run's γ: the confidence stop decides the length."""
        return cls()

    def explain(self) -> dict:
        return {"policy": self.name, "gamma_max": self.gamma, "threshold": self.threshold}


@GAMMA_POLICIES.register("The paper's online window optimisation: γ maximising predicted tokens/s (0: a plain step).", ("gamma",))
class OnlinePolicy(LengthPolicy):
    """The paper's online window optimisation: censored-MLE acceptance over the last h steps, a latency
    model (a_q per draft token; b_p(γ) fitted linearly over drafted steps, plain steps timed apart, see
    :meth:`History.verify_model`) and the γ ∈ 0..γ_max maximising predicted tokens per second; γ = 0 is a
    plain target step, taken once early to time it. While γ* = 0 it probes γ = 1 on a
    :class:`ProbeSchedule` (first after ``probe`` steps) so the estimate can recover. With token trees γ is the
    node budget: the verify cost is measured per fed length as for chains, and the acceptance is per depth, a budget's
    expected tokens those of the depth it reaches (:meth:`History.depth_of`).

    The acceptance estimate adds ``prior_weight`` pseudo-observations at rate ``prior`` to the paper's
    censored MLE: after one fully rejected step the pure MLE is 0 and the policy would stop drafting on a
    single observation; one pseudo-observation makes it take two or three. ``prior_weight=0`` is the paper's."""

    name = "online"

    def __init__(self, gamma: int = 4, gamma_max: int = MAX_GAMMA, h: int = 20, acc_max: float = 0.95, probe: int = 2,
                 prior: float = 0.5, prior_weight: float = 1.0):
        super().__init__(gamma)
        self.gamma_max, self.prior, self.prior_weight = max(gamma_max, gamma), prior, prior_weight  # a tree's budget may pass γ's range
        self.histories: dict[str, History] = defaultdict(lambda: History(h, acc_max))
        self.verify = History(h, acc_max)
        self.probes = ProbeSchedule(probe)
        self.why: dict = {}

    def choose(self, drafter: Drafter, tokens: list[int]) -> int:
        hist = self.histories[drafter.name]
        acc, a_q, b_p = hist.acceptance(self.prior, self.prior_weight), hist.draft_ms_per_token(), self.verify.verify_model()
        if acc is None or a_q is None or b_p is None:
            self.why = {"policy": self.name, "gamma": self.gamma, "reason": "no history yet: initial γ"}
            return self.gamma
        rates = predicted_rates(acc, a_q, b_p, self.gamma_max, depth=hist.depth_of)
        best = max(rates, key=rates.get)
        reason = "argmax of predicted tokens/s"
        if b_p.plain is None:
            best, reason = 0, "timing a plain step: γ = 0 not measured yet"
        elif best > 0:
            self.probes.drafting()
        elif self.probes.plain():
            best, reason = 1, "probe: γ* = 0 for a while"
        self.why = {"policy": self.name, "gamma": best, "acc": acc, "acc_mle": hist.acceptance(), "acc_naive": hist.naive_acceptance(),
                    "a_q_ms": a_q,
                    "b_p_ms": {str(g): b_p(g) for g in rates}, "pred_tok_s": {str(g): r for g, r in rates.items()}, "reason": reason}
        return best

    def observe(self, event) -> None:
        file_step(event, self.histories, self.verify)

    def observe_target(self, event) -> None:
        self.verify.add(record_of(event))

    def explain(self) -> dict:
        return self.why


@GAMMA_POLICIES.register("Q-learning over γ, rewarded with tokens per second.")
class RLPolicy(LengthPolicy):
    """Q-learning over γ ∈ 1..γ_max with state = (was the last step fully accepted?), ε-greedy,
    reward = tokens emitted per second in the step. It reads no γ setting: the agent picks every step's γ."""

    name = "rl"

    def __init__(self, gamma: int = 4, gamma_max: int = MAX_GAMMA, epsilon: float = 0.1, lr: float = 0.2, seed: int = 0):
        super().__init__(gamma)
        self.actions = list(range(1, gamma_max + 1))
        self.q = {s: dict.fromkeys(self.actions, 0.0) for s in (False, True)}
        self.state, self.epsilon, self.lr = False, epsilon, lr
        self.rng = random.Random(seed)
        self.explored = False

    def choose(self, drafter: Drafter, tokens: list[int]) -> int:
        values = self.q[self.state]
        self.explored = self.rng.random() < self.epsilon
        self.gamma = self.rng.choice(self.actions) if self.explored else max(values, key=values.get)
        return self.gamma

    def observe(self, event) -> None:
        if not event.draft_ids:
            return
        reward = len(event.emitted_ids) / max(event.total_ms, 1e-3) * 1e3
        values = self.q[self.state]
        values[self.gamma] += self.lr * (reward - values[self.gamma])
        self.state = event.accepted == len(event.draft_ids)

    def explain(self) -> dict:
        return {"policy": self.name, "gamma": self.gamma, "explored": self.explored, "state_full_accept": self.state,
                "q": {str(a): round(v, 2) for a, v in self.q[self.state].items()}}




def make_policy(name: str, gamma: int) -> LengthPolicy:
    """The registered γ policy ``name`` with initial (or fixed) γ ``gamma``."""
    return GAMMA_POLICIES[name].from_gamma(gamma)






