"""A default Explore run's tokens/s in a real browser against the CLI's on the same settings, interleaved (browser,
CLI, browser, CLI, …) after one warm-up of each. The app runs as ``make run`` runs it (``app.py``, its own process);
the page is Debian's chromium driven by playwright (never ``playwright install``); Run is pressed with every control
at its default, and the CLI runs the same prompt and config (checked field by field from the run's trace file).
Usage: .venv/bin/python scripts/measure_ui_browser.py [ROUNDS] --out PATH   (ROUNDS default 5; e.g. --out out/ui_browser.txt)"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(ROOT))

from bench_steps import refuse_other_settings  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from specviz.models.loading import describe_hardware  # noqa: E402
from specviz.ui.handlers import default_prompt  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
LONG = 300_000  # ms
TRACE_HREF = "() => { const a = document.querySelector('#explore-trace-file a'); return a ? a.getAttribute('href') : null; }"
"""The link to the last run's trace file (a new file for every run)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser_run(page) -> dict:
    """Press Run on the Explore tab as it is; the run's trace file (config and metrics) once it is done."""
    before = page.evaluate(TRACE_HREF)
    page.click("#explore-run")
    page.wait_for_function(f"({TRACE_HREF})() !== {json.dumps(before)} && document.querySelector('#explore-status .sv-status-ok')",
                           timeout=LONG, polling=1000)
    return json.loads(Path(unquote(page.evaluate(TRACE_HREF).split("file=", 1)[1])).read_text())


def cli_run(prompt: str, config: dict) -> dict:
    """The CLI's --json object for ``prompt`` with ``config``'s settings given as options."""
    args = ["--prompt", prompt, "--json", "--preset", config["preset"], "--draft", config["draft"], "--gamma", str(config["gamma"]),
            "--max-new-tokens", str(config["max_new_tokens"])]
    out = subprocess.run([sys.executable, "-m", "specviz", "generate", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def settings_line(config: dict) -> str:
    """The header line naming what a report measured: the default Explore run's settings."""
    return (f"# a default Explore run (every control at its default: {re.sub(r'[{}]', '', json.dumps(config))}) in chromium "
            "(headless), against `python -m specviz generate` with the same prompt and settings, interleaved; tokens/s are each "
            "run's own metrics (new tokens / wall time incl. prefill); the ratio is the median of the rounds' ratios (a round's "
            "two runs are close in time, so load from other processes affects both alike)")


def main(rounds: int, output: str) -> None:
    command = f"# command: .venv/bin/python scripts/measure_ui_browser.py {rounds} --out {output}"
    refuse_other_settings(output, command)
    port = free_port()
    app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env={**os.environ, "PORT": str(port)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines, browser, cli, headline = [], [], [], []
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = chromium.new_page(viewport={"width": 1400, "height": 1000})
            for _ in range(120):
                try:
                    page.goto(f"http://127.0.0.1:{port}/", timeout=5_000)
                    break
                except Exception:
                    time.sleep(1)
            page.wait_for_function("document.querySelector('#model-status') && "
                                   "document.querySelector('#model-status').innerText.includes('Models ready')", timeout=LONG)
            prompt = default_prompt()
            assert page.locator("#explore-prompt textarea").input_value() == prompt
            warm = browser_run(page)
            config = warm["config"]
            cli_config = cli_run(prompt, config)["config"]
            assert cli_config == config, f"the CLI ran other settings: {cli_config} != {config}"
            refuse_other_settings(output, settings_line(config))
            for i in range(rounds):
                load = os.getloadavg()[0]
                run = browser_run(page)
                browser.append(run["metrics"]["tokens_per_s"])
                headline.append(browser[-1] / run["baseline"]["metrics"]["tokens_per_s"])
                cli.append(cli_run(prompt, config)["metrics"]["tokens_per_s"])
                lines.append(f"round {i}: browser {browser[-1]:.2f} tok/s (headline {headline[-1]:.2f}× AR), CLI {cli[-1]:.2f} tok/s, "
                             f"ratio {browser[-1] / cli[-1]:.3f} (load average {load:.2f} before the round)")
                print(lines[-1], flush=True)
            chromium.close()
    finally:
        app.terminate()
        app.wait(60)
    ratio = statistics.median(b / c for b, c in zip(browser, cli))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "specviz"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    header = [command,
              f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit}{' + uncommitted changes' if dirty else ''}; "
              f"{describe_hardware()}",
              settings_line(config),
              f"# prompt: {prompt}"]
    summary = (f"median browser {statistics.median(browser):.2f} tok/s, median CLI {statistics.median(cli):.2f} tok/s; "
               f"median browser / CLI ratio {ratio:.3f}; median headline {statistics.median(headline):.2f}× AR (the run against "
               "the app's AR baseline of the same prompt, measured in the browser after the first run)")
    print(summary)
    path = ROOT / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*header, *lines, summary]) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds", type=int, nargs="?", default=5, help="interleaved browser/CLI rounds (default 5)")
    ap.add_argument("--out", required=True, help="the report file, relative to the repository root")
    a = ap.parse_args()
    main(a.rounds, a.out)
