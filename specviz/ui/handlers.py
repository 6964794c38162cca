"""What every tab's handlers share: the decode queue's concurrency, the example prompts, and the handling that turns
any error into a visible one-line message, with settings named by their labels."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import gradio as gr

from specviz.analysis.suites import load_suite
from specviz.core.env import env
from specviz.core.errors import ConfigError, ModelLoadError
from specviz.runtime.config import DecodeConfig, respelled
from specviz.runtime.prepare import baseline_config
from specviz.ui.decode import generate_timing

log = logging.getLogger("specviz.ui")

USER_ERRORS = (ConfigError, ModelLoadError)
SETTINGS = DecodeConfig.settings()


def decode_concurrency() -> int:
    """Decodes running at once across all sessions (SPECVIZ_DECODE_CONCURRENCY, default 1): runs never share the
    CPU/GPU, so their timings stay honest; other sessions wait in the queue and see their position."""
    try:
        return max(1, int(env("SPECVIZ_DECODE_CONCURRENCY") or 1))
    except ValueError:
        return 1


def user_message(exc: BaseException) -> str:
    """One line for the UI: user mistakes verbatim (settings named by their controls' labels), anything else named as
    unexpected (and logged)."""
    if isinstance(exc, ConfigError):
        return str(respelled(exc, lambda name: f"“{SETTINGS[name].label or name}”"))
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    log.exception("unexpected error in a handler")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"unexpected error ({type(exc).__name__}){': ' + first[:300] if first else ''} — the app is still running"


def notify(message: str) -> None:
    """A toast in the browser (best effort: outside a request there is nobody to tell)."""
    try:
        gr.Warning(message)
    except Exception:
        pass


def guarded(frames: Callable[[], Iterator[tuple]], on_error: Callable[[str], tuple]) -> Iterator[tuple]:
    """Run a handler's generator; any exception becomes a visible error frame instead of a crash."""
    try:
        yield from frames()
    except Exception as exc:
        message = user_message(exc)
        notify(message)
        yield on_error(message)


def time_generate_or_error(config: DecodeConfig, prompt: str, idle: tuple) -> Iterator[tuple]:
    """transformers' generate timed on the AR baseline of ``config`` (:func:`specviz.ui.decode.generate_timing`),
    returned once done, or, when it fails, ``{"error": one line}`` shown beside the run, which stands. It yields the
    handler's frame ``idle`` while it waits, so that a Stop can close it."""
    try:
        for timing in generate_timing(baseline_config(config), prompt):
            if timing is not None:
                return timing
            yield idle
        raise RuntimeError("transformers' generate returned nothing")
    except Exception as exc:
        message = user_message(exc)
        notify(f"transformers' generate failed: {message}")
        return {"error": message}


FIRST_PROMPT = "chat-01"
"""The suite prompt the page opens on: the typical prompt of the defaults' row in ``results/defaults.csv``
(:func:`specviz.analysis.suites.typical_prompt`; ``tests/test_docs.py`` checks it)."""


def example_prompts() -> tuple[list[list[str]], list[str]]:
    """Prompts of the benchmark suites as gr.Examples rows, with 'category: prompt' labels: :data:`FIRST_PROMPT`
    first, then one prompt of each category in turn."""
    try:
        items = interleave_categories(load_suite("all"), FIRST_PROMPT)
    except Exception:
        items = []
    rows = [[it["prompt"]] for it in items]
    labels = [f"{it['category']}: {it['prompt'][:70]}{'…' if len(it['prompt']) > 70 else ''}" for it in items]
    return rows, labels


def interleave_categories(items: list[dict], first: str = "") -> list[dict]:
    """Round-robin over categories, so the first page of examples shows one prompt of each; the item whose ``id`` is
    ``first`` leads, its category first."""
    items = sorted(items, key=lambda it: it["id"] != first)
    by_cat: dict[str, list[dict]] = {}
    for it in items:
        by_cat.setdefault(it["category"], []).append(it)
    rounds = max((len(v) for v in by_cat.values()), default=0)
    return [group[i] for i in range(rounds) for group in by_cat.values() if i < len(group)]


def default_prompt() -> str:
    rows, _ = example_prompts()
    return rows[0][0] if rows else "Write a short poem about the sea."
