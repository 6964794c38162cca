"""The app under load as a report: runs ``tests/ui/test_load.py`` (8 gradio_client sessions at once on loopback) and
writes what it prints (queue wait and latency percentiles, resident memory) under a header naming the command, the
commit and machine, and the sessions' settings. Exits with the test's status.
Usage: .venv/bin/python scripts/measure_load.py --out PATH   (e.g. --out out/load_test.txt)"""

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/ui/test_load.py"
sys.path.insert(0, str(ROOT))

from bench_steps import refuse_other_settings  # noqa: E402

from specviz.core.env import env  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402


def sessions() -> str:
    """What the test's sessions run, from the test itself."""
    spec = importlib.util.spec_from_file_location("test_load", ROOT / TEST)
    test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test)
    configs = "; ".join(f"{prompt!r} {settings}" for prompt, settings in test.CONFIGS)
    return (f"# {len(test.CONFIGS)} gradio_client sessions at once on loopback, each: generate ({test.TOKENS} tokens), then "
            f"Explore ({test.TOKENS} tokens, no baseline; Stop at random in some); one torch thread; "
            f"SPECVIZ_DECODE_CONCURRENCY={env('SPECVIZ_DECODE_CONCURRENCY')}; sessions: {configs}")


def main(output: str) -> int:
    command = f"# command: .venv/bin/python scripts/measure_load.py --out {output}"
    measured = sessions()
    refuse_other_settings(output, command, measured)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    header = [command, f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit}; {describe_hardware()}", measured]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)})
    lines = [*header, *(line for line in run.stdout.splitlines() if line.strip())]
    print("\n".join(lines))
    if run.returncode:
        print(run.stderr[-2000:], file=sys.stderr)
    path = ROOT / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return run.returncode


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the report file, relative to the repository root")
    sys.exit(main(ap.parse_args().out))
