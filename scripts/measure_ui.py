"""Measure the app against the engine: first-step latency after Run, and tokens/s through the UI vs the same
configuration run headless (interleaved, medians). Usage: .venv/bin/python scripts/measure_ui.py [rounds]"""

import os
import re
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from gradio_client import Client  # noqa: E402

from specviz.core.metrics import summarize  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402
from specviz.ui.app import build_app, launch  # noqa: E402
from specviz.ui.bank import shared_models  # noqa: E402

PROMPT = "Write a Python function called is_even that returns True if a number is even and False otherwise."
N, DRAFT, GAMMA, PORT = 64, "head", DecodeConfig.gamma, 7931  # the same settings on both paths


def ui_run(client: Client) -> tuple[float, float]:
    """(seconds until the first token spans arrive, tokens/s the UI reports for the run)."""
    start, first = time.perf_counter(), None
    job = client.submit(prompt=PROMPT, draft=DRAFT, gamma=GAMMA, max_new_tokens=N, baseline="skip", api_name="/explore_run")
    for out in job:
        if first is None and 'class="sv-tok' in str(out[2]):
            first = time.perf_counter() - start
    m = re.search(r"(\d+) tokens in ([\d.]+) s", str(job.result()[0]))
    return first, int(m.group(1)) / float(m.group(2))


def headless_run() -> float:
    run = prepare(DecodeConfig(method="sd", draft=DRAFT, gamma=GAMMA, gamma_policy="fixed", max_new_tokens=N), PROMPT, shared_models().bank)
    return summarize(list(run.events()))["tokens_per_s"]


def main(rounds: int = 4) -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))  # the same threads for both paths
    demo = build_app()
    launch(demo, warm_up=False, prevent_thread_lock=True, server_name="127.0.0.1", server_port=PORT, quiet=True)
    client = Client(f"http://127.0.0.1:{PORT}/", verbose=False)
    ui_run(client), headless_run()  # warm-up
    firsts, ui, bare = [], [], []
    for i in range(rounds):
        order = (ui_run, headless_run) if i % 2 == 0 else (headless_run, ui_run)
        for fn in order:
            if fn is ui_run:
                f, r = ui_run(client)
                firsts.append(f)
                ui.append(r)
            else:
                bare.append(headless_run())
        print(f"round {i}: first step {firsts[-1]:.2f} s, ui {ui[-1]:.1f} tok/s, headless {bare[-1]:.1f} tok/s", flush=True)
    print(f"median first step {statistics.median(firsts):.2f} s; ui/headless tok/s {statistics.median(ui) / statistics.median(bare):.3f}")
    demo.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
