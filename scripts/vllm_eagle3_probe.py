"""Does vLLM's CPU build serve an EAGLE-3 head? A random head for the offline target in the speculators layout (the
layout vLLM reads; the weights are random, so only whether the server starts and answers is in question), exported
as specviz exports a run of it, and started with ``scripts/vllm_server.py``. Writes OUT.md: the config, whether the
server answered a chat request with per-request speculation, and otherwise the refusal (the log's last lines).

    python scripts/vllm_eagle3_probe.py --out results/vllm_eagle3_cpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers import AutoConfig  # noqa: E402

from specviz.models.loading import converted_gguf_dir  # noqa: E402
from specviz.models.paths import cache_dir  # noqa: E402
from specviz.models.vllm_client import VllmClient  # noqa: E402
from tests.eagle3_heads import write_head  # noqa: E402

SERVER = [sys.executable, str(ROOT / "scripts" / "vllm_server.py")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.md")
    ap.add_argument("--port", type=int, default=8017)
    a = ap.parse_args()
    target = converted_gguf_dir()
    head = write_head(cache_dir() / "vllm" / "smollm2-eagle3-random", AutoConfig.from_pretrained(target), layout="speculators",
                      dtype=__import__("torch").float16)
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    started = time.monotonic()
    start = subprocess.run([*SERVER, "start", "--port", str(a.port), "--spec", json.dumps(spec), "--wait", "420"],
                           capture_output=True, text=True)
    took = time.monotonic() - started
    lines = [f"# vLLM's CPU build and an EAGLE-3 head ({time.strftime('%Y-%m-%d')})", "",
             "A random EAGLE-3 head for the offline target in the speculators layout (`tests/eagle3_heads.write_head`), "
             f"served with `--speculative-config '{json.dumps({**spec, 'model': '<head>'})}'` by `scripts/vllm_server.py`. "
             "Made by `python scripts/vllm_eagle3_probe.py --out results/vllm_eagle3_cpu`.", ""]
    try:
        if start.returncode == 0:
            client = VllmClient(f"http://127.0.0.1:{a.port}", 120)
            answer = client.chat(client.model(None), "Count to five.", max_tokens=16, temperature=0.0, top_p=1.0, seed=0)
            spec_metrics = (answer.get("metrics") or {}).get("speculative_decoding")
            lines += [f"**Served**: up in {took:.0f} s; a 16-token chat answered with per-request speculation "
                      f"`{json.dumps(spec_metrics)}`."]
        else:
            tail = (start.stdout + start.stderr).strip().splitlines()[-25:]
            lines += [f"**Refused**: the server did not start ({took:.0f} s; exit {start.returncode}). The end of its output:",
                      "", "```", *tail, "```"]
    finally:
        subprocess.run([*SERVER, "stop", "--port", str(a.port)], capture_output=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
