"""What recording costs: the same decodes with the steps' records on and off (``decode(record=...)``: p and q of each
token, the verify records with their top-10 of p, q and the residual), interleaved prompt by prompt (rotated order)
after a warm-up, as the median per-prompt ratio of wall time (prefill included; the recorder reads the device after
each step's last timing mark, so only wall time sees it). Greedy and sampled, draft head.
Usage: .venv/bin/python scripts/measure_record_overhead.py [PROMPTS_PER_CATEGORY] --out PATH
(PROMPTS_PER_CATEGORY default 2; e.g. --out out/record_overhead.md)"""

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_steps import refuse_other_settings  # noqa: E402

from specviz.analysis.suites import load_suite  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402
from specviz.runtime.bank import ModelBank  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402

TOKENS, ROUNDS = 64, 2


def decode_ms(config: DecodeConfig, prompt: str, bank: ModelBank, record: bool) -> float:
    return list(prepare(config, prompt, bank).events(record))[-1].elapsed_ms


def main(per_category: int, output: str) -> None:
    bank, prompts = ModelBank(), [item["prompt"] for item in load_suite("all", per_category)]
    settings = (f"offline preset, draft head, γ = 3, {TOKENS} new tokens, {len(prompts)} suite prompts, records on and off "
                f"interleaved (rotated order), fastest of {ROUNDS} rounds each.")
    reproduce = f"Reproduce: `.venv/bin/python scripts/measure_record_overhead.py {per_category} --out {output}`"
    columns = "| decoding | median wall-time ratio, records on / off | min | max |"
    refuse_other_settings(output, settings, columns, reproduce)
    lines = [f"# Cost of recording the verification\n\n{describe_hardware()}; {settings}\n", columns, "|---|---|---|---|"]
    for mode, sampling in (("greedy", {}), ("sampled (T 0.8, top-p 0.9)", {"temperature": 0.8, "top_p": 0.9, "seed": 1})):
        config = DecodeConfig(draft="head", gamma=3, gamma_policy="fixed", max_new_tokens=TOKENS, **sampling)
        decode_ms(config, prompts[0], bank, True)  # warm-up
        ratios = []
        for i, prompt in enumerate(prompts):
            best = {True: float("inf"), False: float("inf")}
            for r in range(ROUNDS):
                for record in ((True, False) if (i + r) % 2 == 0 else (False, True)):
                    best[record] = min(best[record], decode_ms(config, prompt, bank, record))
            ratios.append(best[True] / best[False])
        lines.append(f"| {mode} | {statistics.median(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} |")
        print(lines[-1], flush=True)
    lines.append(f"\n{reproduce}")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("per_category", type=int, nargs="?", default=2, help="suite prompts per category (default 2)")
    ap.add_argument("--out", required=True, help="the report file")
    a = ap.parse_args()
    main(a.per_category, a.out)
