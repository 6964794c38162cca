"""The app under load, on loopback only: 8 gradio_client sessions at once run different prompts and settings through
the ``generate`` endpoint and Explore, some pressing Stop at a random moment. Every completed result equals that
configuration's solo CLI result token for token, no session sees another's run, the server answers afterwards, and
its resident memory after 100 more runs is within 10 % of after 10. Queue wait and latency percentiles are printed."""

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import specviz

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TOKENS = 10
CONFIGS = [  # (prompt, settings): greedy and sampled, several drafts, γ and policies; a sampled run equals its solo run
    # only where γ does not depend on timing, so those fix their policy (the default, online, reads timings)
    ("Name three rivers in Europe.", {"draft": "ngram", "gamma": 2}),
    ("Write a haiku about snow.", {"draft": "head", "gamma": 3}),
    ("What is 12 times 7?", {"draft": "draft-s", "gamma": 1}),
    ("List two uses of copper.", {"draft": "head", "gamma": 3, "gamma_policy": "fixed", "temperature": 0.8, "top_p": 0.9, "seed": 4}),
    ("Describe a cat in one sentence.", {"draft": "ngram", "gamma": 4, "gamma_policy": "fsm"}),
    ("Give a synonym for happy.", {"draft": "draft-m", "gamma": 2, "gamma_policy": "fixed", "temperature": 0.7, "seed": 11}),
    ("Translate 'good morning' to French.", {"draft": "head", "gamma": 2, "gamma_policy": "online"}),
    ("Why is the sea salty?", {"draft": "ngram", "gamma": 3, "gamma_policy": "hf-heuristic", "temperature": 1.0, "seed": 2}),
]


def solo_cli(prompt: str, settings: dict) -> list[int]:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    out = subprocess.run([sys.executable, "-m", "specviz", "generate", "--prompt", prompt, f"--max-new-tokens={TOKENS}", *args, "--json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-500:]
    return json.loads(out.stdout)["token_ids"]


def explore_settings(settings: dict) -> dict:
    return {**settings, "max_new_tokens": TOKENS, "baseline": "skip"}


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def percentiles(xs: list[float]) -> str:
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return f"p50 {statistics.median(xs):.2f} s, p90 {pick(0.9):.2f} s, max {xs[-1]:.2f} s (n={len(xs)})"


def test_eight_sessions_at_once_stay_correct_and_apart(app_url):
    from gradio_client import Client

    expected = [solo_cli(prompt, settings) for prompt, settings in CONFIGS]
    rng = random.Random(0)
    results, waits, latencies, errors = {}, [], [], []

    def session(i: int) -> None:
        client = Client(app_url, verbose=False)
        prompt, settings = CONFIGS[i]
        try:
            start = time.perf_counter()
            out = client.predict(prompt, {**settings, "max_new_tokens": TOKENS}, api_name="/generate")
            latencies.append(time.perf_counter() - start)
            results[(i, "generate")] = out["token_ids"]
            stop = rng.random() < 0.4
            start, first = time.perf_counter(), None
            job = client.submit(prompt=prompt, **explore_settings(settings), api_name="/explore_run")
            for frame in job:
                first = first or time.perf_counter() - start
                if stop and 'class="sv-tok' in str(frame[2]):
                    job.cancel()
                    break
            if stop:
                results[(i, "stopped")] = True
                return
            final = job.result()
            waits.append(first or 0.0)
            latencies.append(time.perf_counter() - start)
            trace = specviz.load_trace(final[-3])  # the run's own trace file (then its HTML page and its export)
            assert trace.prompt == prompt, "a session saw another session's run"
            results[(i, "explore")] = trace.token_ids
        except Exception as exc:  # reported below with the session's index
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=session, args=(i,)) for i in range(len(CONFIGS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == []
    for (i, kind), value in results.items():
        if kind != "stopped":
            assert value == expected[i], (i, kind)
    assert sum(kind == "explore" for _, kind in results) >= 3
    print(f"\nload: time to the first Explore frame {percentiles(waits)}; request latency {percentiles(latencies)}")

    fresh = Client(app_url, verbose=False)
    assert fresh.predict(*CONFIGS[0], api_name="/generate")["token_ids"][:TOKENS] == expected[0]  # still serving

    def runs(n: int) -> None:
        clients = [Client(app_url, verbose=False) for _ in range(5)]
        for k in range(n):
            prompt, settings = CONFIGS[k % len(CONFIGS)]
            client = clients[k % len(clients)]
            if k % 2:
                client.predict(prompt, {**settings, "max_new_tokens": 4}, api_name="/generate")
            else:
                client.predict(prompt=prompt, **{**explore_settings(settings), "max_new_tokens": 4}, api_name="/explore_run")

    runs(10)
    after_10 = rss_mb()
    runs(90)
    after_100 = rss_mb()
    print(f"resident memory after 10 runs {after_10:.0f} MB, after 100 {after_100:.0f} MB")
    assert after_100 <= 1.10 * after_10
