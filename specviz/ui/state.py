"""Per-session state (held in ``gr.State``, never shared between browser sessions) and the translation of
UI control values into a validated :class:`DecodeConfig`.

Everything stored here is plain data (dicts, lists, floats) so it pickles (ZeroGPU) and exports as JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from specviz.core.errors import ConfigError
from specviz.runtime.config import DecodeConfig

BASELINE_CACHE_SIZE = 8


def new_session() -> dict:
    """A fresh session: AR baselines cached per (prompt, settings), the last Explore and Compare results, and the
    views the step panels show (trace contents by panel key)."""
    return {"baselines": {}, "last": None, "compare": None, "runs": 0, "live": {"running": False, "tokens": 0}, "views": {}}


def ensure_session(session: dict | None) -> dict:
    return session if isinstance(session, dict) and "views" in session else new_session()


def make_config(*, preset: str, method: str | None = None, draft: str | None = None, chain: Any = None, select: Any = None,
                **values: Any) -> DecodeConfig:
    """Validated settings of one run from the controls' values (DecodeConfig's names); raises ConfigError with a
    one-line message for any bad value. With a selection the engine picks the draft per step, so the draft box is
    ignored."""
    if not preset:
        raise ConfigError("choose a preset")
    selected = names(select)
    return DecodeConfig.from_values({**values, "preset": preset, "method": method or "sd", "chain": names(chain),
                                     "select": selected, "draft": None if selected else draft})


def names(value: Any) -> list[str]:
    """A list of names from a multiselect (list) or a comma-separated string."""
    if not value:
        return []
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return [str(n).strip() for n in items if str(n).strip()]


def baseline_key(config: DecodeConfig, prompt: str) -> str:
    """What an AR baseline depends on: the prompt and every setting that changes the target's output."""
    fields = {k: getattr(config, k) for k in ("preset", "temperature", "top_p", "seed", "max_new_tokens", "chat")}
    return json.dumps({"prompt": prompt, **fields}, sort_keys=True)


def get_baseline(session: dict, key: str) -> dict | None:
    return session["baselines"].get(key)


def put_baseline(session: dict, key: str, record: dict) -> None:
    """Remember an AR run for this (prompt, settings); keeps the newest few."""
    baselines = session["baselines"]
    baselines.pop(key, None)
    baselines[key] = record
    while len(baselines) > BASELINE_CACHE_SIZE:
        baselines.pop(next(iter(baselines)))


def run_record(label: str, config: DecodeConfig, events: Sequence[dict], result: dict, **extra: Any) -> dict:
    """A finished run as plain data: config, metrics, text, token ids, per-step events, theory."""
    return {"label": label, "config": config.to_dict(), "events": list(events), "metrics": result["metrics"],
            "text": result["text"], "token_ids": result["token_ids"], "theory": result.get("theory"),
            "finished_at": time.strftime("%H:%M:%S"), **extra}
