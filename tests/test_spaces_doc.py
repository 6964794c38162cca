"""docs/spaces.md's ZeroGPU figures are rendered from the GPU check's results files: the committed block matches them, and
a figure changed by hand fails the check."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "render_zerogpu.py"


def check(doc: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--doc", str(doc)], capture_output=True, text=True, cwd=ROOT)


def test_the_zerogpu_block_is_what_the_results_give():
    out = check(ROOT / "docs" / "spaces.md")
    assert out.returncode == 0, out.stderr


def test_a_figure_changed_by_hand_fails_the_check(tmp_path):
    doc = tmp_path / "spaces.md"
    shutil.copy(ROOT / "docs" / "spaces.md", doc)
    text = doc.read_text()
    row = re.search(r"\| 64 \| ([\d.]+) \|", text)  # the eager tok/s of a 64-token call
    assert row
    doc.write_text(text.replace(row.group(0), f"| 64 | {float(row.group(1)) + 1:g} |"))
    out = check(doc)
    assert out.returncode != 0 and "differs from the results" in out.stderr
