"""The two per-step decisions the loop asks for, in their simplest form: a :class:`LengthPolicy` says how many
tokens to draft (the base class drafts a fixed γ; adaptive policies live in ``specviz.methods.policies``), a
:class:`FirstDraft` selector says which drafter drafts (``specviz.methods.selection`` chooses online).

A policy sees finished steps through ``observe`` and answers ``choose`` before each step; ``explain`` returns
why it chose, and the engine attaches that to the step. γ policies register in
:data:`~specviz.core.registry.GAMMA_POLICIES` and are built with ``from_gamma(gamma)``.
"""

from __future__ import annotations

from specviz.core.drafters import Drafter, StopRule
from specviz.core.registry import GAMMA_POLICIES

MAX_GAMMA = 10
"""The longest draft of a step: the γ setting's upper end and the cap of every adaptive policy."""


@GAMMA_POLICIES.register("Fixed γ: the same draft length every step.", ("gamma",))
class LengthPolicy:
    """Fixed γ; the base class of every adaptive policy."""

    name = "fixed"
    stop_rule: StopRule | None = None

    def __init__(self, gamma: int = 4):
        self.gamma = gamma

    @classmethod
    def from_gamma(cls, gamma: int) -> LengthPolicy:
        """The registry's protocol: a policy from the run's γ setting."""
        return cls(gamma)

    def choose(self, drafter: Drafter, tokens: list[int]) -> int:
        return self.gamma

    def observe(self, event) -> None:
        """Learn from a finished step (a :class:`specviz.core.record.StepEvent`)."""

    def observe_target(self, event) -> None:
        """A step taken without this policy (a plain step, or another drafter's): only the target's timing applies."""

    def explain(self) -> dict | None:
        return {"policy": self.name, "gamma": self.gamma}


class FirstDraft:
    """Draft selector that always uses the first drafter."""

    name = "single"

    def choose(self, drafters: list[Drafter], tokens: list[int]) -> Drafter | None:
        """The drafter of this step, or None for a plain target step."""
        return drafters[0]

    def observe(self, event) -> None:
        pass

    def explain(self) -> dict | None:
        return None
