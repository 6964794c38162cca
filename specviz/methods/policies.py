"""Length policies (how many tokens to draft this step) and draft selectors (which drafter drafts).

A policy learns from each finished step's :class:`~specviz.core.policy.Outcome` through ``observe`` and answers
``choose`` before each step with a :class:`~specviz.core.policy.Choice`: γ, why (the engine attaches it to the step
for the UI) and, for the confidence policy, the rule that stops the draft. Defaults (documented in the
README): history h = 20 steps, Acc_max = 0.95, one pseudo-observation at 0.5 in ``online``'s estimate,
γ ∈ [1, ``MAX_GAMMA``] (0 allowed for ``online``), first probe after 2 plain steps, backing off to 64 (a draft whose first
step was rejected looks useless on that one step; waiting 8 steps cost an eighth of a 64-token answer).
"""

from __future__ import annotations

import random
from functools import partial

import torch

from specviz.core.drafters import Drafter, followers
from specviz.core.policy import MAX_GAMMA, Choice, LengthPolicy, Outcome
from specviz.core.registry import GAMMA_POLICIES
from specviz.methods.estimation import Estimates, ProbeSchedule, continuation, predicted_rates


@GAMMA_POLICIES.register("+1 after a fully accepted step, −1 after a rejection.", ("gamma",))
class FSMPolicy(LengthPolicy):
    """+``up`` after a fully accepted step, −``down`` after a rejection, within [γ_min, γ_max]."""

    name = "fsm"
    up, down = 1, 1

    def __init__(self, gamma: int = 4, gamma_min: int = 1, gamma_max: int = MAX_GAMMA):
        super().__init__(gamma)
        self.gamma_min, self.gamma_max = gamma_min, gamma_max

    def observe(self, outcome: Outcome) -> None:
        if not outcome.drafted:
            return
        step = self.up if outcome.accepted == outcome.drafted else -self.down
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

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        hit = len(followers(torch.tensor(tokens), self.ngram, self.ngram)) > 0
        gamma = self.long_gamma if hit else self.gamma
        return Choice(gamma, partial(dict, policy=self.name, gamma=gamma, suffix_seen_before=hit))


@GAMMA_POLICIES.register("transformers' confidence stop: draft until a token's draft probability < 0.4.")
class ConfidencePolicy(LengthPolicy):
    """transformers' ``assistant_confidence_threshold``: draft up to γ_max, stop after the first token whose draft
    probability falls below the threshold (default 0.4); that token stays in the draft, as transformers keeps it."""

    name = "confidence"

    def __init__(self, gamma: int = MAX_GAMMA, threshold: float = 0.4):
        super().__init__(gamma)
        self.threshold = threshold

    @classmethod
    def from_gamma(cls, gamma: int, estimates: object | None = None, profile: dict[int, float] | None = None) -> ConfidencePolicy:
        """Its γ is a maximum, γ_max, whatever the run's γ: the confidence stop decides the length."""
        return cls()

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        return Choice(self.gamma, partial(dict, policy=self.name, gamma_max=self.gamma, threshold=self.threshold), self.stop_rule)

    def stop_rule(self, path: list[float]) -> bool:
        """Stop after a token whose draft probability (the last of its ``path``'s) is below the threshold."""
        return path[-1] < self.threshold


@GAMMA_POLICIES.register("The paper's online window optimisation: γ maximising predicted tokens/s (0: a plain step); a single "
                         "path stops after the token past which drafting on stops paying.", ("gamma",))
class OnlinePolicy(LengthPolicy):
    """The paper's online window optimisation: censored-MLE acceptance over the last h steps, a latency
    model (a_q per draft token; b_p(γ) from the machine's verify profile scaled by the run, else measured per γ, see
    :class:`~specviz.methods.estimation.VerifyCost`) and the γ ∈ 0..γ_max maximising predicted tokens per second; γ = 0
    is a plain target step (without a profile priced at the shortest verify measured until one is taken: no step is
    spent only to time it). While γ* = 0 it probes on a :class:`ProbeSchedule` (first after ``probe`` steps) so the
    estimate can recover, at the drafting γ it predicts fastest: where the verify cost is a staircase a longer probe can
    cost less than γ = 1, and each one says more about the acceptance. With token trees γ is the node budget: the
    verify cost is measured per fed length as for chains, and the acceptance is per depth, a budget's expected tokens
    those of the depth it reaches (:meth:`History.depth_of`).

    The acceptance estimate adds ``prior_weight`` pseudo-observations at rate ``prior`` to the paper's
    censored MLE: after one fully rejected step the pure MLE is 0 and the policy would stop drafting on a
    single observation; one pseudo-observation makes it take two or three. ``prior_weight=0`` is the paper's. Given
    the run's shared :class:`Estimates` (draft selection), it reads those, filed by the selector.

    With ``calibrated_stop`` (single paths; off: the paper's policy; by default on where the run has the machine's verify
    profile, a CPU, whose draws cost nothing to read: on a GPU each read would wait on the device, and the draft stays
    there until the step's one read) γ is the step's most, at least γ*, and the
    draft stops after the first token past which no longer draft is worth its time (:func:`continuation`): the tokens
    drafted so far count at the acceptance their own draft probabilities had in this run (a calibration per drafter,
    shared with the selector), the ones to come at the window's. A confident draft runs on past γ*, a doubtful one stops
    short of it, and stopping costs no draft forward: the rule reads the probability of the token just drawn."""

    name = "online"
    prices_verify = True

    def __init__(self, gamma: int = 4, gamma_max: int = MAX_GAMMA, h: int = 20, acc_max: float = 0.95, probe: int = 2,
                 prior: float = 0.5, prior_weight: float = 1.0, estimates: Estimates | None = None,
                 profile: dict[int, float] | None = None, calibrated_stop: bool | None = None):
        super().__init__(gamma)
        self.gamma_max = max(gamma_max, gamma)  # a tree's budget may pass γ's range
        self.files = estimates is None  # shared estimates are filed by the selector that built them
        self.estimates = estimates or Estimates(h, acc_max, prior=prior, prior_weight=prior_weight, profile=profile)
        self.probes = ProbeSchedule(probe)
        self.calibrated_stop = bool(self.estimates.profile) if calibrated_stop is None else calibrated_stop

    @classmethod
    def from_gamma(cls, gamma: int, estimates: object | None = None, profile: dict[int, float] | None = None) -> OnlinePolicy:
        return cls(gamma, estimates=estimates, profile=profile)

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        hist = self.estimates.histories[drafter.name]
        acc, a_q, b_p = self.estimates.acceptance(drafter.name), hist.draft_ms_per_token(), self.estimates.verify_cost()
        if acc is None or a_q is None or b_p is None:
            return Choice(self.gamma, partial(dict, policy=self.name, gamma=self.gamma, reason="no history yet: initial γ"))
        rates = predicted_rates(acc, a_q, b_p, b_p.longest_priced(self.gamma_max), depth=hist.depth_of)
        best = max(rates, key=rates.get)
        reason = "argmax of predicted tokens/s"
        if best > 0:
            self.probes.drafting()
        elif self.probes.plain():
            best, reason = max((g for g in rates if g > 0), key=rates.get), "probe: γ* = 0 for a while, the best drafting γ"
        gamma, stop = best, None
        if best > 0 and self.calibrated_stop and hist.single_paths():
            gamma, stop = continuation(hist.calibration, acc, a_q, b_p, max(rates.values()) / 1e3, best,
                                       b_p.longest_priced(self.gamma_max))
        mle, naive = hist.acceptance(), hist.naive_acceptance()  # of this step's window: the history moves on after it
        return Choice(gamma, lambda: {"policy": self.name, "gamma": gamma, "gamma_star": best, "acc": acc, "acc_mle": mle,
                                      "acc_naive": naive, "a_q_ms": a_q, "b_p_ms": {str(g): b_p(g) for g in rates},
                                      "pred_tok_s": {str(g): r for g, r in rates.items()}, "reason": reason,
                                      "stop": "calibrated" if stop else None}, stop)

    def observe(self, outcome: Outcome) -> None:
        if self.files:
            self.estimates.file(outcome)

    def observe_target(self, outcome: Outcome) -> None:
        if self.files:
            self.estimates.verify.add(outcome)


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

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        values = self.q[self.state]
        explored = self.rng.random() < self.epsilon
        self.gamma = self.rng.choice(self.actions) if explored else max(values, key=values.get)  # the action observe() rewards
        gamma, state, q = self.gamma, self.state, list(values.items())  # observe() updates them after the step
        return Choice(gamma, lambda: {"policy": self.name, "gamma": gamma, "explored": explored, "state_full_accept": state,
                                      "q": {str(a): round(v, 2) for a, v in q}})

    def observe(self, outcome: Outcome) -> None:
        if not outcome.drafted:
            return
        reward = outcome.emitted / max(outcome.total_ms, 1e-3) * 1e3
        values = self.q[self.state]
        values[self.gamma] += self.lr * (reward - values[self.gamma])
        self.state = outcome.accepted == outcome.drafted


def make_policy(name: str, gamma: int, estimates: Estimates | None = None, profile: dict[int, float] | None = None) -> LengthPolicy:
    """The registered γ policy ``name`` with initial (or fixed) γ ``gamma``, reading the run's shared ``estimates`` if it
    reads any, or else its own shaped by the target's verify ``profile``."""
    return GAMMA_POLICIES[name].from_gamma(gamma, estimates, profile)
