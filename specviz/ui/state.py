"""Per-session state (held in ``gr.State``, never shared between browser sessions) and the translation of
UI control values into a validated :class:`DecodeConfig`.

Everything stored here is plain data (dicts, lists, floats) so it pickles (ZeroGPU) and exports as JSON.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from specviz.core.errors import ConfigError
from specviz.runtime.config import DecodeConfig

BASELINE_CACHE_SIZE = 8


def new_session() -> dict:
    """A fresh session: AR baselines cached per (prompt, settings), the last Explore and Compare results."""
    return {"baselines": {}, "last": None, "compare": None, "runs": 0, "live": {"running": False, "tokens": 0}}


def ensure_session(session: dict | None) -> dict:
    return session if isinstance(session, dict) and "baselines" in session else new_session()


def _number(name: str, value: Any, kind: type = float) -> Any:
    """A finite number from a UI value, or a one-line ConfigError naming the control."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{name} is empty")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got '{value}'") from None
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number, got '{value}'")
    if kind is int:
        if number != int(number):
            raise ConfigError(f"{name} must be a whole number, got '{value}'")
        return int(number)
    return number


def names(value: Any) -> list[str]:
    """A list of names from a multiselect (list) or a comma-separated string."""
    if not value:
        return []
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return [str(n).strip() for n in items if str(n).strip()]


def make_config(*, preset: str, method: str, draft: str | None, gamma: Any, gamma_policy: str, accept: str,
                judge_threshold: Any, lenience: Any, topk: Any, temperature: Any, top_p: Any, seed: Any,
                max_new_tokens: Any, chat: bool = True, chain: Any = None, select: Any = None) -> DecodeConfig:
    """Validated settings of one run; raises ConfigError with a one-line message for any bad value."""
    if not preset:
        raise ConfigError("choose a preset")
    seed_value = _number("seed", seed, int)
    if not 0 <= seed_value < 2**63:
        raise ConfigError(f"seed must be between 0 and 2^63 − 1, got {seed_value}")
    topk_value = _number("top-k", topk, int)
    if topk_value < 1:
        raise ConfigError(f"top-k must be at least 1, got {topk_value}")
    lenience_value = _number("lenience", lenience)
    if not 0 < lenience_value <= 1:
        raise ConfigError(f"lenience must be in (0, 1], got {lenience_value}")
    judge_value = _number("judge threshold δ", judge_threshold)
    if not 0 <= judge_value <= 1:
        raise ConfigError(f"judge threshold δ must be in [0, 1], got {judge_value}")
    selected = names(select)
    config = DecodeConfig(  # with a selection, the engine picks the draft per step: the single-draft box is ignored
        preset=str(preset).strip(), method=str(method or "sd").strip(),
        draft=(str(draft).strip() or None) if draft and not selected else None, chain=names(chain), select=selected,
        gamma=_number("γ", gamma, int), gamma_policy=str(gamma_policy or "fixed").strip(),
        accept=str(accept or "exact").strip(), judge_threshold=judge_value, lenience=lenience_value, topk=topk_value,
        temperature=_number("temperature", temperature), top_p=_number("top-p", top_p), seed=seed_value,
        max_new_tokens=_number("max new tokens", max_new_tokens, int), chat=bool(chat),
    )
    return config.validate()


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
