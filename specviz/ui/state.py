"""Per-session state (held in ``gr.State``, never shared between browser sessions) and the translation of a form's
values into a validated :class:`DecodeConfig`.

Everything stored here is plain data (dicts, lists, floats) so it pickles (ZeroGPU) and exports as JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specviz.runtime.config import DecodeConfig


def new_session() -> dict:
    """A fresh session: AR baselines cached per (prompt, settings), the last Explore and Compare results, and the
    views the step panels show (trace contents by panel key)."""
    return {"baselines": {}, "last": None, "compare": None, "runs": 0, "live": {"running": False, "tokens": 0}, "views": {}}


def ensure_session(session: dict | None) -> dict:
    return session if isinstance(session, dict) and "views" in session else new_session()


def form_config(values: Mapping[str, Any]) -> DecodeConfig:
    """A validated config from a form's (or a table row's) values by setting name; a ConfigError names the first
    bad value. While a chain or a selection names the drafts, the draft box is ignored."""
    if values.get("chain") or values.get("select"):
        values = {**values, "draft": None}
    return DecodeConfig.from_values(values)
