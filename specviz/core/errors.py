"""The user-facing errors (a setting, a model, a server). Their messages are one line, fit for the CLI, the UI and a notebook."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line, fit for a CLI or the UI."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libraries raise multi-line text), or its type's name."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class ConfigError(ValueError):
    """A user mistake in the run's settings; the message is one line."""


class ServerError(ModelLoadError):
    """A model server could not be used, or its answer is not data this version reads; the message is one line."""
