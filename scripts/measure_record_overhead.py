"""What recording costs: the same decodes with the steps' records on and off (``decode(record=...)``: p and q of each
token, the verify records with their top-10 of p, q and the residual), interleaved prompt by prompt (rotated order)
after a warm-up, as the median per-prompt ratio of wall time (prefill included; the recorder reads the device after
each step's last timing mark, so only wall time sees it). Greedy and sampled, draft head.
Usage: .venv/bin/python scripts/measure_record_overhead.py [prompts per category] [output]
(default 2, results/record_overhead_wall.md)"""

import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.analysis.suites import load_suite  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402
from specviz.runtime.bank import ModelBank  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402

TOKENS, ROUNDS = 64, 2


def decode_ms(config: DecodeConfig, prompt: str, bank: ModelBank, record: bool) -> float:
    return list(prepare(config, prompt, bank).events(record))[-1].elapsed_ms


def main(per_category: int = 2, output: str = "results/record_overhead_wall.md") -> None:
    bank, prompts = ModelBank(), [item["prompt"] for item in load_suite("all", per_category)]
    lines = [f"# Cost of recording the verification\n\n{describe_hardware()}; offline preset, draft head, γ = 3, {TOKENS} new tokens, "
             f"{len(prompts)} suite prompts, records on and off interleaved (rotated order), fastest of {ROUNDS} rounds each.\n",
             "| decoding | median wall-time ratio, records on / off | min | max |", "|---|---|---|---|"]
    for mode, sampling in (("greedy", {}), ("sampled (T 0.8, top-p 0.9)", {"temperature": 0.8, "top_p": 0.9, "seed": 1})):
        config = DecodeConfig(draft="head", gamma=3, max_new_tokens=TOKENS, **sampling)
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
    lines.append(f"\nReproduce: `.venv/bin/python scripts/measure_record_overhead.py {per_category} {output}`")
    Path(output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2, sys.argv[2] if len(sys.argv) > 2 else "results/record_overhead_wall.md")
