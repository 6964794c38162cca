"""The real vLLM server (``make vllm-setup``'s venv), started once, from the ``--speculative-config`` specviz exports
for a local draft-m run: ``generate --server`` against it (JSON, trace file) and against its refusals.

The server takes minutes to start on a small CPU (a compile warm-up), so every test here shares one, on one xdist
worker."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.api.trace import load_trace
from specviz.core.errors import ServerError
from specviz.models.vllm_client import VllmClient
from specviz.models.vllm_steps import read_answer
from specviz.runtime.config import DecodeConfig
from specviz.runtime.serving import serving_export

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = [sys.executable, str(ROOT / "scripts" / "vllm_server.py")]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
PROMPT = "Write a Python function that returns the largest number in a list."
LOCAL = ["--draft", "draft-m", "--gamma-policy", "fixed", "--gamma", "3", "--temperature", "0"]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

if not (ROOT / ".venv-vllm" / "bin" / "python").exists():
    pytest.skip("no vLLM venv: `make vllm-setup` (make test makes it)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    """A server started from the exported config of ``generate`` with LOCAL's settings."""
    exported = serving_export(DecodeConfig(draft="draft-m", gamma=3, gamma_policy="fixed", temperature=0))
    config = exported["vllm_speculative_config"]
    port = free_port()
    start = subprocess.run([*SCRIPT, "start", "--port", str(port), "--spec", json.dumps(config)], capture_output=True,
                           text=True, env=ENV, timeout=900)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield f"http://127.0.0.1:{port}", config
    finally:
        subprocess.run([*SCRIPT, "stop", "--port", str(port)], env=ENV, timeout=120)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specviz", "generate", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)


def test_the_exported_config_starts_vllm_and_generate_server_matches_the_local_run(served, tmp_path):
    url, config = served
    assert config == {"method": "draft_model", "model": str(ROOT / "assets" / "models" / "smollm2-draft-m"),
                      "num_speculative_tokens": 3}
    r = cli("--prompt", PROMPT, "--server", url, "--max-new-tokens", "40", "--temperature", "0", "--json",
            "--trace-out", str(tmp_path / "server.json"))
    assert r.returncode == 0, r.stderr
    server = json.loads(r.stdout)
    local = json.loads(cli("--prompt", PROMPT, *LOCAL, "--max-new-tokens", "40", "--json").stdout)
    assert set(server) == set(local) and local["serving"]["vllm_speculative_config"] == config
    assert server["token_ids"] == local["token_ids"]  # greedy, same target and draft: the same tokens
    steps = server["steps"]
    assert steps[0]["emitted_ids"] == server["token_ids"][:1] and all(s["gamma"] == 3 for s in steps[1:])
    assert sum(len(s["emitted_ids"]) for s in steps) == len(server["token_ids"])
    assert server["source"]["speculative_config"]["num_speculative_tokens"] == 3
    counted = server["source"]["speculative_decoding"]["num_accepted_draft_tokens"]  # past the end too, in its last step
    assert server["metrics"]["accepted"] == sum(s["accepted"] for s in steps) and counted - 3 <= server["metrics"]["accepted"] <= counted
    trace = load_trace(tmp_path / "server.json")
    assert trace.token_ids == server["token_ids"] and trace.source["url"] == url
    assert [s.accepted for s in trace.steps] == [s["accepted"] for s in steps]


def test_the_real_server_refuses_what_specviz_refuses(served):
    url, _ = served
    r = cli("--prompt", PROMPT, "--server", url, "--model", "no-such-model")
    assert r.returncode == 2 and "does not serve model 'no-such-model'" in r.stderr and "Traceback" not in r.stderr
    client = VllmClient(url)
    two = client.chat(client.model(None), PROMPT, max_tokens=4, temperature=0.8, top_p=1.0, seed=0, n=2)
    with pytest.raises(ServerError, match="n = 1"):
        read_answer(two)
    with pytest.raises(ServerError, match="HTTP 404"):
        client.request("/v1/no-such-route")
