"""Files the app hands to the browser (trace files, HTML pages, CSV and JSON exports): one fresh folder per export
under the temp directory, pruned after an hour (gradio has served its own copy by then)."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

EXPORT_ROOT = Path(tempfile.gettempdir()) / "specviz-exports"


def prune_exports(max_age_s: float = 3600.0) -> None:
    """Remove export folders older than an hour (gradio has served its own copy by then)."""
    if not EXPORT_ROOT.is_dir():
        return
    for folder in EXPORT_ROOT.iterdir():
        try:
            if time.time() - folder.stat().st_mtime > max_age_s:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass


def export_folder() -> Path:
    """A new, empty folder for one export."""
    prune_exports()
    folder = EXPORT_ROOT / uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    return folder
