"""What makes each file under results/: the steps of ``scripts/run_benchmarks.sh`` (``NAME) COMMAND ;;``, each naming
its outputs as ``--out PATH``, ``> PATH`` or ``tee PATH`` with PATH under results/ or assets/) and its
``# elsewhere: GLOB :: COMMAND [:: NOTE]`` lines for files made another way (a GPU, training, older settings). The
docs render it and ``tests/test_docs.py`` checks that every results file is covered."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_SCRIPT = ROOT / "scripts" / "run_benchmarks.sh"
STEP = re.compile(r"^\s+([\w-]+)\)\s*(.*?);;", re.M | re.S)
ELSEWHERE = re.compile(r"^# elsewhere: (\S+) :: (.+?)(?: :: (.+))?$", re.M)
OUTPUT = re.compile(r"(?:--out\s+|>>?\s*|tee\s+)((?:results|assets)/[\w./-]*\w)")


def benchmark_steps() -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """``scripts/run_benchmarks.sh``'s steps (name → command, from its ``case`` block) and its ``# elsewhere:`` lines
    (glob, command, note)."""
    text = BENCH_SCRIPT.read_text()
    cases = text[text.index("case $step in"):text.index("esac")]
    steps = {name: re.sub(r"\s*\\\n\s*", " ", command).strip() for name, command in STEP.findall(cases)}
    steps.pop("*", None)
    return steps, ELSEWHERE.findall(text)


def default_steps() -> list[str]:
    """The steps ``scripts/run_benchmarks.sh`` runs when ``STEPS`` is not set."""
    m = re.search(r'^STEPS=\$\{STEPS:-"([^"]*)"\}', BENCH_SCRIPT.read_text(), re.M)
    if m is None:
        raise SystemExit("bench_steps: scripts/run_benchmarks.sh has no default STEPS line")
    return m[1].split()


def outputs(command: str) -> list[str]:
    """The paths (under results/ or assets/) a step's command writes."""
    return list(dict.fromkeys(OUTPUT.findall(command)))


def made_by(path: str, steps: dict[str, str], elsewhere: list[tuple[str, str, str]]) -> tuple[str, str] | None:
    """The command that makes ``path`` (relative to the checkout) and a note on it: a step's ``STEPS=name
    scripts/run_benchmarks.sh``, or an elsewhere line's command; None when neither names it."""
    for name, command in steps.items():
        for out in outputs(command):
            if path == out or path.startswith(out + ".") or path.startswith(out.rstrip("/") + "/"):
                return f"STEPS={name} scripts/run_benchmarks.sh", ""
    for glob, command, note in elsewhere:
        if fnmatch.fnmatch(path, glob):
            return command, note
    return None


def committed(path: Path) -> bool:
    """Whether ``path`` is a file git tracks in this checkout."""
    return path.exists() and subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=ROOT,
                                            capture_output=True).returncode == 0


def refuse_other_settings(out: str | Path, *lines: str) -> None:
    """Exit, saying why, when ``out`` is a committed file whose text lacks one of ``lines`` (this run's command and the
    settings it records): a rerun must not replace a committed result made with other settings."""
    path = ROOT / out
    if not committed(path):
        return
    text = path.read_text()
    other = [line for line in lines if line not in text]
    if other:
        raise SystemExit(f"refusing to overwrite {path.relative_to(ROOT)}: it is committed and was made with other settings "
                         f"(it lacks {other[0]!r}); pass another --out, or delete the file first to replace it")


def write_report(out: Path, lines: list[str]) -> None:
    """Write a measurement's report (one line per item) to ``out`` and print it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def results_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.is_file())


