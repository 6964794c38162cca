"""One registry per strategy kind. A strategy registers once, beside its class, with its name (the class's
``name``), the run settings it reads and a one-line description; the run configuration, the CLI, the UI and
the benchmark read the registries instead of lists of names. How a class is built from the settings is its
kind's protocol (documented where the kind's base class lives)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """A registered strategy."""

    name: str
    cls: type
    description: str
    params: tuple[str, ...]


class Registry(Mapping[str, type]):
    """Strategy classes of one kind by name, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, description: str, params: tuple[str, ...] = (), name: str | None = None) -> Callable[[type], type]:
        """Class decorator; ``params`` are the names of the run settings the strategy reads; ``name`` defaults
        to the class's ``name``."""
        def add(cls: type) -> type:
            key = name or cls.name
            if key in self._entries:
                raise ValueError(f"{self.kind} '{key}' is registered twice")
            self._entries[key] = Entry(key, cls, description, params)
            return cls
        return add

    def __getitem__(self, name: str) -> type:
        return self._entries[name].cls

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> Entry:
        return self._entries[name]

    def entries(self) -> list[Entry]:
        return list(self._entries.values())


GAMMA_POLICIES = Registry("γ policy")
ACCEPT_RULES = Registry("acceptance rule")
DRAFTERS = Registry("drafter kind")
