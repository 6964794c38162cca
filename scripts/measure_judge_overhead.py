"""What judge decoding adds to a verify step: the pre-norm capture hook and the judge head (with its confidence inputs), timed
against the same verify forward without them (interleaved, medians).

    .venv/bin/python scripts/measure_judge_overhead.py --out PATH      # e.g. --out out/judge_overhead.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from bench_steps import refuse_other_settings  # noqa: E402

from specviz.core.hidden import last_layer  # noqa: E402
from specviz.methods.judge import JudgeHead, default_head_path  # noqa: E402
from specviz.models.backends import cached_model
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402

REPEATS, GAMMA = 200, 4


def main(out: Path) -> None:
    reproduce = f"Reproduce: `.venv/bin/python scripts/measure_judge_overhead.py --out {out}`"
    settings = f"Verify forward of {GAMMA + 1} tokens"
    refuse_other_settings(out, reproduce, settings, f"{REPEATS} interleaved repeats")
    run = prepare(DecodeConfig(method="ar", max_new_tokens=8), "Explain why the sky is blue.", ModelBank())
    lm = run.target.lm
    taps = {False: (), True: (last_layer(lm.model),)}
    models = {capture: cached_model(lm, run.target.vocab_size, taps=taps[capture]) for capture in (False, True)}
    head = JudgeHead.load(default_head_path(lm.name), lm.name, lm.model.config.hidden_size)
    tokens = run.prompt_ids + [42] * GAMMA
    draft_ids = torch.tensor(tokens[-GAMMA:])
    for target in models.values():
        target.prefill(run.prompt_ids)
    plain, judged = [], []
    for i in range(REPEATS):
        for capture in ((False, True) if i % 2 else (True, False)):
            start = time.perf_counter()
            verified = models[capture].forward(tokens, keep=GAMMA + 1)
            if capture:  # as JudgeRule does: states with the drafts as inputs, the rows that predicted them
                head.score(head.inputs(verified.prenorm[1:], verified.logits[:GAMMA], draft_ids)).tolist()
            (judged if capture else plain).append(time.perf_counter() - start)
    base, extra = statistics.median(plain), statistics.median(judged) - statistics.median(plain)
    line = (f"{settings} on `{lm.name}` ({torch.get_num_threads()} threads, {REPEATS} interleaved "
            f"repeats): median {1e3 * base:.2f} ms plain, {1e3 * (base + extra):.2f} ms with the pre-norm capture and the judge "
            f"head → the judge adds {1e3 * extra:.3f} ms = {100 * extra / base:.2f} % of verify time.")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# Judge overhead\n\n{line}\n\n{reproduce}\n")
    print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the report file")
    main(ap.parse_args().out)
