"""specviz installs and runs from a fresh virtual environment, as a wheel (assets as ``specviz/_assets``) and as an
editable install (assets read from the checkout's ``assets/``), with the API and the ``specviz`` console script.

The fresh environments reuse this environment's installed dependencies through a ``.pth`` line (the equivalent of
``--system-site-packages`` when this interpreter is itself a venv) and pip installs with ``--no-index``, so nothing is
downloaded; the converted target in ``SPECVIZ_CACHE`` (default ``~/.cache/specviz``) is shared, so nothing is reconverted."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAD = Path("models") / "smollm2-head" / "head.safetensors"

CHECK = textwrap.dedent("""
    import json, sys, sysconfig
    import specviz
    from specviz.models import paths
    trace = specviz.speculate("Say hi.", max_new_tokens=8)
    print(trace.text, file=sys.stderr)
    print(json.dumps({"file": specviz.__file__, "assets": str(paths.ASSETS), "purelib": sysconfig.get_path("purelib"),
                      "prefix": sys.prefix, "text": trace.text, "tokens": len(trace.token_ids)}))
""")


def _git_files(*args: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the copied source is what `git ls-files` lists)")
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, check=True)
    return [f for f in out.stdout.decode().split("\0") if f]


def copy_source(dest: Path) -> Path:
    """The checkout's tracked files, plus untracked (not ignored) files under assets/ and specviz/, as they are now."""
    files = _git_files() + _git_files("--others", "--exclude-standard", "--", "assets", "specviz")
    for name in dict.fromkeys(files):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the working tree is not part of it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def base_python() -> str:
    base = getattr(sys, "_base_executable", None)
    if base and Path(base).exists() and Path(base).resolve() != Path(sys.executable).resolve():
        return base
    return str(Path(sys.base_prefix) / "bin" / "python3")


def env() -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "TOKENIZERS_PARALLELISM": "false",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


def fresh_venv(path: Path, cwd: Path) -> Path:
    """A new venv (no pip of its own) that sees this environment's packages after its own, pip and setuptools included."""
    run([base_python(), "-m", "venv", "--without-pip", path], cwd)
    python = path / "bin" / "python"
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd).stdout.strip())
    assert purelib.is_relative_to(path), purelib
    (purelib / "_specviz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def install_and_check(tmp_path: Path, editable: bool) -> dict:
    src = copy_source(tmp_path / "src")
    work = tmp_path / "work"  # outside the source tree: `import specviz` must find the installed package
    work.mkdir()
    python = fresh_venv(tmp_path / "venv", work)
    run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "-q", *(["-e"] if editable else []), src], work)

    result = json.loads(run([python, "-c", CHECK], work).stdout.strip().splitlines()[-1])
    assert Path(result["prefix"]) == tmp_path / "venv"
    assert result["tokens"] > 0 and result["text"].strip(), result

    cli = run([tmp_path / "venv" / "bin" / "specviz", "generate", "--prompt", "hi", "--max-new-tokens", "4", "--json"], work)
    generated = json.loads(cli.stdout)
    assert generated["token_ids"] and len(generated["token_ids"]) <= 4, generated
    assert set(generated) >= {"text", "metrics", "steps", "config"}
    return {**result, "src": src}


@pytest.mark.slow
def test_wheel_install_runs_from_its_own_assets(tmp_path):
    result = install_and_check(tmp_path, editable=False)
    package = Path(result["purelib"]).resolve() / "specviz"
    assert package.is_relative_to(tmp_path.resolve() / "venv")
    assert Path(result["file"]).resolve().parent == package, f"imported {result['file']}, not the installed package"
    assert Path(result["assets"]).resolve() == package / "_assets", result["assets"]
    assert (package / "_assets" / HEAD).is_file()
    for draft in ("smollm2-draft-s", "smollm2-draft-m"):
        assert (package / "_assets" / "models" / draft / "model.safetensors").is_file(), draft


@pytest.mark.slow
def test_editable_install_reads_the_checkout_assets(tmp_path):
    result = install_and_check(tmp_path, editable=True)
    src = result["src"]
    assert Path(result["file"]).resolve() == (src / "specviz" / "__init__.py").resolve(), result["file"]
    assert Path(result["assets"]).resolve() == (src / "assets").resolve(), result["assets"]
    assert (Path(result["assets"]) / HEAD).is_file()
