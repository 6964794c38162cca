"""Where specviz reads its bundled assets and keeps what it builds (converted models, measured settings)."""

from __future__ import annotations

from pathlib import Path

from specviz.core.env import env


def _assets() -> Path:
    """``assets/`` of a source checkout (also what ``pip install -e .`` uses), else the copy a wheel installs
    as ``specviz/_assets``."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "_assets"
    return installed if installed.is_dir() else package.parent / "assets"


ASSETS = _assets()


def cache_dir() -> Path:
    """Where converted models and measured settings are kept (``SPECVIZ_CACHE`` overrides)."""
    return Path(env("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz")
