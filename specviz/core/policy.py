"""The two per-step decisions the loop asks for, in their simplest form: a :class:`LengthPolicy` says how many
tokens to draft (the base class drafts a fixed γ; adaptive policies live in ``specviz.methods.policies``), a
:class:`FirstDraft` selector says which drafter drafts (``specviz.methods.selection`` chooses online).

Before each step the selector's ``choose`` returns a :class:`Pick` and the policy's a :class:`Choice`, each with its
reasons, which the engine attaches to the step; after it both learn from the step's :class:`Outcome`. γ policies
register in :data:`~specviz.core.registry.GAMMA_POLICIES` and are built with ``from_gamma(gamma)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.core.drafters import Drafter, StopRule
from specviz.core.registry import GAMMA_POLICIES

MAX_GAMMA = 10
"""The longest draft of a step: the γ setting's upper end and the cap of every adaptive policy."""


@dataclass(frozen=True)
class Outcome:
    """A finished step as the policies see it: tokens (a tree: nodes) drafted and accepted, the time drafting, verifying
    and in all, tokens emitted, the deepest drafted node (None: as deep as ``gamma``, a chain) and who drafted."""

    gamma: int
    accepted: int
    draft_ms: float
    verify_ms: float
    emitted: int
    total_ms: float
    depth: int | None = None
    drafter: str = "target"

    @property
    def reach(self) -> int:
        """The most drafts the step could have accepted."""
        return self.gamma if self.depth is None else self.depth


@dataclass(frozen=True)
class Choice:
    """A policy's answer for one step: how many tokens to draft (a tree: its node budget), why, and the rule that may
    stop a chain early."""

    gamma: int
    why: dict | None = None
    stop: StopRule | None = None


@dataclass(frozen=True)
class Pick:
    """A selector's answer for one step: the drafter (None: a plain target step) and why."""

    drafter: Drafter | None
    why: dict | None = None


@GAMMA_POLICIES.register("Fixed γ: the same draft length every step.", ("gamma",))
class LengthPolicy:
    """Fixed γ; the base class of every adaptive policy."""

    name = "fixed"

    def __init__(self, gamma: int = 4):
        self.gamma = gamma

    @classmethod
    def from_gamma(cls, gamma: int) -> LengthPolicy:
        """The registry's protocol: a policy from the run's γ setting."""
        return cls(gamma)

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        """This step's γ for ``drafter`` after ``tokens``, with the policy's notes on the choice."""
        return Choice(self.gamma, {"policy": self.name, "gamma": self.gamma})

    def observe(self, outcome: Outcome) -> None:
        """Learn from a step this policy chose."""

    def observe_target(self, outcome: Outcome) -> None:
        """A step taken without this policy (a plain step, or another drafter's): only the target's timing applies."""


class FirstDraft:
    """Draft selector that always uses the first drafter."""

    name = "single"

    def choose(self, drafters: list[Drafter], tokens: list[int]) -> Pick:
        """The drafter of this step (None: a plain target step)."""
        return Pick(drafters[0] if drafters else None)

    def observe(self, outcome: Outcome) -> None:
        pass
