"""The two per-step decisions the loop asks for, in their simplest form: a γ policy (a :class:`LengthPolicy`; the
simplest is :class:`FixedPolicy`, adaptive ones live in ``specviz.methods.policies``) says how many tokens to draft,
a :class:`FirstDraft` selector says which drafter drafts (``specviz.methods.selection`` chooses online).

Before each step the selector's ``choose`` returns a :class:`Pick` and the policy's a :class:`Choice`, each with its
reasons (built only if the step is recorded), which the engine attaches to the step apart; after it both learn from
the step's :class:`Outcome`. γ policies register in :data:`~specviz.core.registry.GAMMA_POLICIES` and are built with
``from_gamma(gamma, estimates)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from specviz.core.drafters import Drafter, StopRule
from specviz.core.registry import GAMMA_POLICIES

MAX_GAMMA = 10
"""The longest draft of a step: the γ setting's upper end and the cap of every adaptive policy."""


Reasons = Callable[[], dict]
"""A decision's reasons, built only when a step is recorded, after its timed spans: a policy's or selector's
``choose`` returns this, not the dict, so a step that does not record never builds one."""


@dataclass(frozen=True)
class Outcome:
    """A finished step as the policies see it: tokens (a tree: nodes) drafted and accepted, the time drafting (the
    drafting span alone) and verifying (the forward and the acceptance test) and from the step's start to its commit,
    tokens emitted, the deepest drafted node (None: as deep as ``drafted``, a single path), who drafted and, where the
    policy's stop rule read them, the draft probability of each drafted token."""

    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    emitted: int
    total_ms: float
    depth: int | None = None
    drafter: str = "target"
    confidence: tuple[float, ...] = ()

    @property
    def reach(self) -> int:
        """The most drafts the step could have accepted."""
        return self.drafted if self.depth is None else self.depth


@dataclass(frozen=True)
class Choice:
    """A policy's answer for one step: how many tokens to draft (a tree: its node budget; with a stop rule, the most),
    why, and the rule that may stop a path early (:data:`~specviz.core.tree.StopRule`)."""

    gamma: int
    why: Reasons
    stop: StopRule | None = None


@dataclass(frozen=True)
class Pick:
    """A selector's answer for one step: the drafter (None: a plain target step) and why."""

    drafter: Drafter | None
    why: Reasons | None = None


class LengthPolicy:
    """The base class of every γ policy: it drafts its current γ (``gamma``, which an adaptive policy moves in
    ``observe``); a subclass registers in :data:`~specviz.core.registry.GAMMA_POLICIES` under its ``name``."""

    name = "length"
    prices_verify = False
    """Whether it prices the target's verify per γ: the run then hands it the target's verify profile."""

    def __init__(self, gamma: int = 4):
        self.gamma = gamma

    @classmethod
    def from_gamma(cls, gamma: int, estimates: object | None = None, profile: dict[int, float] | None = None) -> LengthPolicy:
        """The registry's protocol: a policy from the run's γ setting and the run's shared estimates of each drafter
        (``specviz.methods.estimation.Estimates``, for a policy that reads them; None: its own if it needs any, shaped by
        the target's verify ``profile``, γ → ms measured at load)."""
        return cls(gamma)

    def choose(self, drafter: Drafter, tokens: list[int]) -> Choice:
        """This step's γ for ``drafter`` after ``tokens``, with the policy's notes on the choice."""
        return Choice(self.gamma, partial(dict, policy=self.name, gamma=self.gamma))

    def observe(self, outcome: Outcome) -> None:
        """Learn from a step this policy chose."""

    def observe_target(self, outcome: Outcome) -> None:
        """A step taken without this policy (a plain step, or another drafter's): only the target's timing applies."""


@GAMMA_POLICIES.register("Fixed γ: the same draft length every step.", ("gamma",))
class FixedPolicy(LengthPolicy):
    """Fixed γ: the same draft length every step (γ = 0: plain autoregressive steps)."""

    name = "fixed"


class FirstDraft:
    """Draft selector that always uses the first drafter."""

    name = "single"

    def choose(self, drafters: list[Drafter], tokens: list[int]) -> Pick:
        """The drafter of this step (None: a plain target step)."""
        return Pick(drafters[0] if drafters else None)

    def observe(self, outcome: Outcome) -> None:
        pass
