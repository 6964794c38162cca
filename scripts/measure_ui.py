"""Measure the app against the engine: first-step latency after Run, and tokens/s through the UI vs the same
configuration run headless (interleaved, medians). Both paths run the app's default γ and γ policy with the head.
Usage: .venv/bin/python scripts/measure_ui.py [ROUNDS] --out PATH   (ROUNDS default 4; e.g. --out out/ui_measure.txt)"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_steps import refuse_other_settings  # noqa: E402
from gradio_client import Client  # noqa: E402

from specviz.core.metrics import summarize  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402
from specviz.ui.app import build_app, launch  # noqa: E402
from specviz.ui.bank import shared_models  # noqa: E402

PROMPT = "Write a Python function called is_even that returns True if a number is even and False otherwise."
SETTINGS = {"draft": "head", "gamma": DecodeConfig.gamma, "gamma_policy": DecodeConfig.gamma_policy, "max_new_tokens": 64}
"""The same settings on both paths: the head at the app's default γ and γ policy."""
PORT = 7931


def ui_run(client: Client) -> tuple[float, float]:
    """(seconds until the first token spans arrive, tokens/s the UI reports for the run)."""
    start, first = time.perf_counter(), None
    job = client.submit(prompt=PROMPT, **SETTINGS, baseline="skip", api_name="/explore_run")
    for out in job:
        if first is None and 'class="sv-tok' in str(out[2]):
            first = time.perf_counter() - start
    m = re.search(r"(\d+) tokens in ([\d.]+) s", str(job.result()[0]))
    return first, int(m.group(1)) / float(m.group(2))


def headless_run() -> float:
    run = prepare(DecodeConfig(method="sd", **SETTINGS), PROMPT, shared_models().bank)
    return summarize(list(run.events()))["tokens_per_s"]


def main(rounds: int, output: str) -> None:
    threads = int(os.environ.get("THREADS", "1"))  # the same threads for both paths
    command = f"# command: .venv/bin/python scripts/measure_ui.py {rounds} --out {output}"
    measured = (f"# {SETTINGS['draft']}, gamma {SETTINGS['gamma']} ({SETTINGS['gamma_policy']}), {SETTINGS['max_new_tokens']} tokens, "
                f"{threads} torch thread(s): through the app (gradio_client, no baseline) and headless, interleaved; medians of the rounds")
    refuse_other_settings(output, command, measured)
    torch.set_num_threads(threads)
    demo = build_app()
    launch(demo, warm_up=False, prevent_thread_lock=True, server_name="127.0.0.1", server_port=PORT, quiet=True)
    client = Client(f"http://127.0.0.1:{PORT}/", verbose=False)
    ui_run(client), headless_run()  # warm-up
    firsts, ui, bare = [], [], []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = [command, f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit}; {describe_hardware()}", measured]
    print("\n".join(lines), flush=True)
    for i in range(rounds):
        order = (ui_run, headless_run) if i % 2 == 0 else (headless_run, ui_run)
        for fn in order:
            if fn is ui_run:
                f, r = ui_run(client)
                firsts.append(f)
                ui.append(r)
            else:
                bare.append(headless_run())
        lines.append(f"round {i}: first step {firsts[-1]:.2f} s, ui {ui[-1]:.1f} tok/s, headless {bare[-1]:.1f} tok/s")
        print(lines[-1], flush=True)
    ratio = statistics.median(ui) / statistics.median(bare)
    lines.append(f"median first step {statistics.median(firsts):.2f} s; ui/headless tok/s {ratio:.3f}")
    print(lines[-1])
    demo.close()
    path = ROOT / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds", type=int, nargs="?", default=4, help="interleaved rounds of an app run and a headless run (default 4)")
    ap.add_argument("--out", required=True, help="the report file, relative to the repository root")
    a = ap.parse_args()
    main(a.rounds, a.out)
