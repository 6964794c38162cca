"""Draft selection: which drafter drafts this step (or none: a plain target step), and a length policy per drafter."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from specviz.core.drafters import Drafter
from specviz.core.policy import MAX_GAMMA, Choice, FirstDraft, LengthPolicy, Outcome, Pick
from specviz.methods.estimation import Estimates, ProbeSchedule, predicted_rates


class PerDrafterPolicy(LengthPolicy):
    """One length policy per drafter, built on first use, so that with draft selection each drafter's γ
    is learnt from its own steps only (a shared history would mix an n-gram's acceptance with a model's)."""

    def __init__(self, make: Callable[[], LengthPolicy]):
        self.make, self.policies = make, {}
        self.seen: list[Outcome] = []  # every step so far, for the target's timing in policies built later
        self.name = make().name

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        if drafter.name not in self.policies:
            self.policies[drafter.name] = self.make()
            for outcome in self.seen:
                self.policies[drafter.name].observe_target(outcome)
        return self.policies[drafter.name].choose(drafter, tokens)

    def observe(self, outcome: Outcome) -> None:
        self.seen.append(outcome)
        for name, policy in self.policies.items():  # the target's cost does not depend on who drafted
            if name == outcome.drafter:
                policy.observe(outcome)
            else:
                policy.observe_target(outcome)


class OnlineSelector(FirstDraft):
    """Pick the drafter with the best predicted throughput max_γ G(γ) (their draft-model selection).

    Acceptance per drafter is the censored MLE over its own last ``h`` steps, shrunk towards its prior
    (the acceptance predicted from prompt features) by ``prior_weight`` pseudo-observations (the run's
    :class:`Estimates`, which it files and the γ policy reads too); the target's
    verify cost b_p(γ) does not depend on who drafted, so it is measured on every step. A drafter is explored
    (tried first, predicted-best first) until it has ``explore`` steps of its own: its draft cost is only
    known once it has drafted. A drafter that has not drafted yet is explored only while it could still win:
    at its prior acceptance (Acc_max without one) and free drafting, its best rate must reach the best
    predicted rate of the drafters already measured (this is re-checked every step, so a drafter skipped
    early is tried once the others falter). When no drafter's best predicted rate beats a plain target step (priced at
    the shortest verify measured until one is taken), the step is plain (``choose`` returns None), except on a
    :class:`ProbeSchedule` (first after ``probe`` such steps), which lets the best drafter try again."""

    name = "online-select"

    def __init__(self, h: int = 20, acc_max: float = 0.95, explore: int = 1, gamma_max: int = MAX_GAMMA,
                 priors: dict[str, float] | None = None, prior_weight: float = 2.0, probe: int = 2,
                 profile: dict[int, float] | None = None):
        self.estimates = Estimates(h, acc_max, priors, prior=None, prior_weight=prior_weight, profile=profile)
        self.explore, self.gamma_max = explore, gamma_max
        self.probes = ProbeSchedule(probe)

    def acceptance(self, name: str) -> float | None:
        return self.estimates.acceptance(name)

    def predicted(self, drafter: Drafter) -> float | None:
        est = self.estimates
        acc, a_q, b_p = est.acceptance(drafter.name), est.histories[drafter.name].draft_ms_per_token(), est.verify_cost()
        if acc is None or a_q is None or b_p is None:
            return None
        return max(predicted_rates(acc, a_q, b_p, b_p.longest_priced(self.gamma_max), 1).values())

    def could_win(self, drafter: Drafter, best_measured: float | None) -> bool:
        """Whether a drafter with no steps yet, at its prior acceptance and no draft cost, would reach
        ``best_measured``, the best predicted rate of the drafters that have drafted (None: nothing measured yet)."""
        b_p = self.estimates.verify_cost()
        if best_measured is None or b_p is None:
            return True
        acc = self.estimates.priors.get(drafter.name, self.estimates.acc_max)
        return max(predicted_rates(acc, 0.0, b_p, b_p.longest_priced(self.gamma_max), 1).values()) >= best_measured

    def choose(self, drafters: list[Drafter], tokens: list[int]) -> Pick:
        ready = [d for d in drafters if d.can_draft(tokens)]  # an n-gram drafter with no match would waste the step
        idle = [d.name for d in drafters if d not in ready]

        def pick(drafter: Drafter | None, reason: str, **notes) -> Pick:
            name = drafter.name if drafter else None
            return Pick(drafter, partial(dict, selector=self.name, idle=idle, drafter=name, **notes, reason=reason))

        if not ready:
            return pick(None, "no drafter has a proposal: plain step")
        drafters = ready
        steps = {d.name: len(self.estimates.histories[d.name].drafted()) for d in drafters}
        best_measured = None
        if not all(steps.values()):  # someone has not drafted yet: is it worth a try?
            best_measured = max((r for d in drafters if steps[d.name] and (r := self.predicted(d)) is not None), default=None)
        fresh = [d for d in drafters if steps[d.name] < self.explore and (steps[d.name] or self.could_win(d, best_measured))]
        fresh.sort(key=lambda d: -self.estimates.priors.get(d.name, 0.0))  # predicted-best first
        if fresh:
            return pick(fresh[0], "exploring: too little history")
        b_p = self.estimates.verify_cost()
        if b_p is None:
            return pick(None, "no drafter to explore: a plain step")
        scores = {d.name: self.predicted(d) or 0.0 for d in drafters}
        best = max(drafters, key=lambda d: scores[d.name])
        plain = 1e3 / b_p(0) if b_p(0) > 0 else 0.0
        notes = {"pred_tok_s": {**scores, "plain": plain}, "acc": {d.name: self.acceptance(d.name) for d in drafters}}
        if scores[best.name] >= plain:
            self.probes.drafting()
            return pick(best, "best predicted tokens/s", **notes)
        if self.probes.plain():
            return pick(best, "probe: plain for a while", **notes)
        return pick(None, "no drafter beats a plain step", **notes)

    def observe(self, outcome: Outcome) -> None:
        self.estimates.file(outcome)
