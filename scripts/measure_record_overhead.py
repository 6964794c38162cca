"""What recording each step's verification (p, q, u, top-10 of p, q and the residual) costs: the same decodes with
the records on and off, interleaved prompt by prompt (rotated order) after a warm-up, as the median per-prompt ratio
of decode time (the sum of step times; prefill excluded). Greedy and sampled, the offline preset's default drafter.
Usage: .venv/bin/python scripts/measure_record_overhead.py [prompts per category] → results/record_overhead.md"""

import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.analysis.suites import load_suite  # noqa: E402
from specviz.core.acceptance import ExactRule  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402
from specviz.runtime.bank import ModelBank  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402

TOKENS, ROUNDS = 64, 2
RECORDS = ExactRule.records


def decode_ms(config: DecodeConfig, prompt: str, bank: ModelBank, record: bool) -> float:
    ExactRule.records = RECORDS if record else (lambda self, *args: [])
    try:
        return sum(e.total_ms for e in prepare(config, prompt, bank).events())
    finally:
        ExactRule.records = RECORDS


def main(per_category: int = 2) -> None:
    bank, prompts = ModelBank(), [item["prompt"] for item in load_suite("all", per_category)]
    lines = [f"# Cost of recording the verification\n\n{describe_hardware()}; offline preset, draft head, γ = 3, {TOKENS} new tokens, "
             f"{len(prompts)} suite prompts, records on and off interleaved (rotated order), fastest of {ROUNDS} rounds each.\n",
             "| decoding | median decode-time ratio, records on / off | min | max |", "|---|---|---|---|"]
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
    lines.append("\nReproduce: `.venv/bin/python scripts/measure_record_overhead.py`")
    Path("results/record_overhead.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
