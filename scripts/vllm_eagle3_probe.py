"""Does vLLM's CPU build serve an EAGLE-3 head? A random head for the offline target in the speculators layout, with a
draft vocabulary subset as the published heads have (the weights are random, so only whether the server starts and
answers is in question). Its ``--speculative-config`` is the one specviz exports for a local run of the head, and
``scripts/vllm_server.py`` starts the server from it. Writes OUT.md: the config, and whether the server answered a
chat request with per-request speculation, or the errors its log names.

    python scripts/vllm_eagle3_probe.py --out results/vllm_eagle3_cpu
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from specviz.models.loading import converted_gguf_dir  # noqa: E402
from specviz.models.paths import cache_dir  # noqa: E402
from specviz.models.vllm_client import VllmClient  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.serving import serving_export  # noqa: E402
from tests.eagle3_heads import write_head  # noqa: E402

SERVER = [sys.executable, str(ROOT / "scripts" / "vllm_server.py")]
DRAFT_VOCAB = 16384
"""The head's draft vocabulary (the target's first ids), a subset as in the published heads (which ship d2t with it)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.md")
    ap.add_argument("--port", type=int, default=8017)
    a = ap.parse_args()
    target = converted_gguf_dir()
    config = AutoConfig.from_pretrained(target)
    head = write_head(cache_dir() / "vllm" / "smollm2-eagle3-random", config, layout="speculators", dtype=torch.float16,
                      draft_ids=list(range(DRAFT_VOCAB)))
    exported = serving_export(DecodeConfig(draft=str(head), gamma_policy="fixed", gamma=3))
    spec = exported["vllm_speculative_config"]  # a KeyError here: specviz did not export the head
    started = time.monotonic()
    start = subprocess.run([*SERVER, "start", "--port", str(a.port), "--spec", json.dumps(spec), "--wait", "420"],
                           capture_output=True, text=True)
    took = time.monotonic() - started
    lines = [f"# vLLM's CPU build and an EAGLE-3 head ({time.strftime('%Y-%m-%d')})", "",
             f"A random EAGLE-3 head for the offline target in the speculators layout (`tests/eagle3_heads.write_head`, "
             f"a draft vocabulary of the first {DRAFT_VOCAB} ids), served with the `--speculative-config` specviz exports "
             f"for a local run of it, `{json.dumps({**spec, 'model': '<head>'})}`, by `scripts/vllm_server.py`. "
             "Made by `python scripts/vllm_eagle3_probe.py --out results/vllm_eagle3_cpu`.", ""]
    try:
        if start.returncode == 0:
            client = VllmClient(f"http://127.0.0.1:{a.port}", 120)
            answer = client.chat(client.model(None), "Count to five.", max_tokens=16, temperature=0.0, top_p=1.0, seed=0)
            spec_metrics = (answer.get("metrics") or {}).get("speculative_decoding")
            lines += [f"**Served**: up in {took:.0f} s; a 16-token chat answered with per-request speculation "
                      f"`{json.dumps(spec_metrics)}`."]
        else:
            log = (cache_dir() / "vllm" / f"server-{a.port}.log").read_text(errors="replace").splitlines()
            causes = list(dict.fromkeys(re.sub(r"^\(\w+ pid=\d+\) \w+ [\d\- :]+\[[^\]]+\]\s*", "", line) for line in log
                                        if re.search(r"\b\w+(Error|Exception): ", line)))
            lines += [f"**Refused**: the server did not start ({took:.0f} s; exit {start.returncode}). The errors its log "
                      "names, in order:", "", "```", *causes[:8], "```"]
    finally:
        subprocess.run([*SERVER, "stop", "--port", str(a.port)], capture_output=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
