"""What gradio's queue polling costs a decode served by the app: one process serves the app (idle, no browser) and
decodes the default Explore configuration on its model thread, alternating the queue's poll intervals between gradio's
default outside Windows (1 ms, progress 10 ms) and the app's QUEUE_POLL_S, pair by pair (the order flips every pair).
Reports each run's median step time (prefill excluded) and the median of the pairs' ratios.
Usage: .venv/bin/python scripts/measure_queue_poll.py [PAIRS] --out PATH   (PAIRS default 8; e.g. --out out/ui_queue_poll.txt)"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(ROOT))

from bench_steps import refuse_other_settings  # noqa: E402

from specviz.core.record import StepEvent  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.ui.app import GRADIO_POLL_S, QUEUE_POLL_S, build_app, launch  # noqa: E402
from specviz.ui.bank import shared_models  # noqa: E402
from specviz.ui.decode import decode_steps  # noqa: E402
from specviz.ui.handlers import default_prompt  # noqa: E402


def median_step_ms(settings: dict, prompt: str) -> float:
    events = [StepEvent.from_dict(step) for batch in decode_steps(settings, prompt) for step in batch]
    times = [e.elapsed_ms for e in events]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def main(pairs: int, output: str) -> None:
    settings = DecodeConfig(draft="head", max_new_tokens=64).to_dict()  # as Explore opens
    command = f"# command: .venv/bin/python scripts/measure_queue_poll.py {pairs} --out {output}"
    measured = (f"# the default Explore configuration ({settings['draft']}, gamma {settings['gamma']}, {settings['max_new_tokens']} "
                "tokens) decoded on the app's model thread while the app serves, idle; median step time of each run, prefill excluded")
    refuse_other_settings(output, command, measured)
    demo = build_app()
    launch(demo, warm_up=True, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    while shared_models().warming:
        time.sleep(1)
    prompt = default_prompt()
    median_step_ms(settings, prompt)
    arms = {"gradio": GRADIO_POLL_S, "app": QUEUE_POLL_S}
    steps: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(pairs):
        for name in (list(arms) if i % 2 else list(arms)[::-1]):
            demo._queue.sleep_when_free, demo._queue.progress_update_sleep_when_free = arms[name]
            time.sleep(0.5)
            steps[name].append(median_step_ms(settings, prompt))
    demo.close()
    ratio = statistics.median(a / g for a, g in zip(steps["app"], steps["gradio"]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = [command, f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit}; {describe_hardware()}", measured,
             *(f"{name} poll {arms[name]} s: " + ", ".join(f"{ms:.1f}" for ms in values) + f" ms (median {statistics.median(values):.1f})"
               for name, values in steps.items()),
             f"median of the pairs' step-time ratios, app / gradio: {ratio:.3f}"]
    print("\n".join(lines))
    path = ROOT / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    os._exit(0)  # the model thread and gradio's threads need not wind down


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", type=int, nargs="?", default=8, help="interleaved pairs of decodes (default 8)")
    ap.add_argument("--out", required=True, help="the report file, relative to the repository root")
    a = ap.parse_args()
    main(a.pairs, a.out)
