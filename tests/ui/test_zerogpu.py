"""The app on a fake ZeroGPU (tests/ui/zerogpu_app.py): its decorated calls run in forked worker processes, CUDA in the
app's own process raises, nothing unpicklable and no tensor may cross, and Stop must end the worker. Explore, Compare
and the ``generate`` endpoint all run, Stop reports what it kept, and every GPU call asks for a computed duration."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, seconds: float, what: str):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_app_runs_under_zerogpu_rules(tmp_path):
    from gradio_client import Client

    from specviz.ui.bank import default_preset, warmup_configs
    from tests.ui.conftest import free_port

    port, status = free_port(), tmp_path / "workers.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "ui" / "zerogpu_app.py"), str(port), str(status)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def client():
            try:
                return Client(f"http://127.0.0.1:{port}/", verbose=False)
            except Exception:
                return None

        c = wait_for(client, 180, "the app")
        workers = lambda: json.loads(status.read_text()) if status.exists() else {"alive": [], "workers": 0, "durations": []}
        # every warm-up call has run, in workers: a call forked while the warm-up still loads would inherit a held lock
        warmups = len(warmup_configs(default_preset()))
        wait_for(lambda: workers()["workers"] >= warmups and not workers()["alive"], 240, "the warm-up calls")

        result = c.predict("Name two oceans.", {"draft": "ngram", "gamma": 2, "max_new_tokens": 8}, api_name="/generate")
        assert result["metrics"]["new_tokens"] == len(result["token_ids"]) > 0

        final = c.predict(prompt="Name two oceans.", draft="ngram", gamma=2, max_new_tokens=8, baseline="after the run",
                          api_name="/explore_run")
        assert "Done (run #" in final[0] and "AR measured after the run" in final[0]

        before = workers()["workers"]
        job = c.submit(prompt="Write a long story about the sea.", draft="ngram", gamma=2, max_new_tokens=400, baseline="skip",
                       api_name="/explore_run")
        wait_for(lambda: any('class="sv-tok' in str(frame[2]) for frame in job.outputs()), 120, "the first tokens")
        assert workers()["alive"], "the decode runs in a worker process"
        job.cancel()
        wait_for(lambda: workers()["workers"] > before and not workers()["alive"], 30, "Stop to end the worker")

        table = {"headers": ["label", "method", "draft", "gamma", "gamma_policy", "accept"],
                 "data": [["ngram γ=2", "sd", "ngram", 2, "fixed", "exact"]]}
        compared = c.predict(prompt="Name two oceans.", configs=table, max_new_tokens=6, api_name="/compare_run")
        assert "Done:" in compared[0]
        durations = workers()["durations"]
        assert durations and all(1 <= d <= 120 for d in durations)
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "CUDA was initialised" not in output and "crossed the GPU process boundary" not in output, output[-3000:]
