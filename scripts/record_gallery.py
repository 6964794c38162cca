"""Record the app's example traces (assets/traces/): each method on the offline preset, greedy and sampled, each with
its AR baseline. Usage: .venv/bin/python scripts/record_gallery.py  (run on a quiet machine: the traces hold timings)."""

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import specviz  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "assets" / "traces"
PROMPT = "Explain in three sentences why the sky is blue."
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
METHODS = {
    "speculative decoding, feature head": {"draft": "head"},
    "adaptive: online gamma, draft selection": {"draft": ["head", "draft-m", "ngram"], "gamma_policy": "online"},
    "judge decoding": {"draft": "draft-s", "accept": "judge", "judge_threshold": 0.5},
    "polybasic chain ngram, draft-s, draft-m": {"chain": ["ngram", "draft-s", "draft-m"]},
    "prompt lookup (n-gram)": {"draft": "ngram"},
    "token tree, feature head": {"draft": "head", "tree_nodes": 8},
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for settings in METHODS.values():  # warm-up: no recorded run pays a first call's cost
        specviz.speculate(PROMPT, max_new_tokens=8, baseline=True, **settings)
    for name, settings in METHODS.items():
        for mode, sampling in (("greedy", {}), ("sampled", SAMPLED)):
            trace = specviz.speculate(PROMPT, max_new_tokens=64, baseline=True, **settings, **sampling)
            path = OUT / f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{mode}.json"
            trace.save(path)
            print(f"{path.name}: {trace.metrics['new_tokens']} tokens, {trace.speedup:.2f}× AR, {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
