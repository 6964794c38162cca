"""Length policies (how many tokens to draft this step) and draft selectors (which drafter drafts).

A policy sees the finished steps through ``observe`` and answers ``choose`` before each step; what it
returns from ``explain`` is attached to the step so the UI can show why it chose that γ.
"""

from __future__ import annotations

from .drafters import Drafter, StopRule


class LengthPolicy:
    """Fixed γ; the base class of every adaptive policy."""

    name = "fixed"
    stop_rule: StopRule | None = None

    def __init__(self, gamma: int = 4):
        self.gamma = gamma

    def choose(self, drafter: Drafter) -> int:
        return self.gamma

    def observe(self, event) -> None:
        """Learn from a finished step (a :class:`specviz.engine.StepEvent`)."""

    def explain(self) -> dict | None:
        return None


class FirstDraft:
    """Draft selector that always uses the first drafter."""

    name = "single"

    def choose(self, drafters: list[Drafter]) -> Drafter:
        return drafters[0]

    def observe(self, event) -> None:
        pass
