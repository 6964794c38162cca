"""Top-1 agreement of draft models (and feature heads) with the offline target, teacher-forced on the target's
own greedy answers: the first draft token's agreement, with the true text before it.

    mkdir -p out && .venv/bin/python scripts/draft_agreement.py [DRAFT_DIR ...] > out/draft_agreement.md   # default: bundled drafts, heads

Measured per draft on the evaluation suites (all 48 prompts, 64 new tokens, chat template), per category and overall,
and on the distillation data's held-out answers (the split ``specviz.training.drafts fit`` reports). Older drafts can be
compared by restoring them from git, e.g. ``git archive 3c1a678 assets/models | tar -x -C /tmp/old``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from specviz.analysis.suites import load_suite
from specviz.core.hidden import layer_outputs
from specviz.methods.feature_head import is_feature_head, load_head, tap_states
from specviz.models.loading import load_model, load_tokenizer
from specviz.models.paths import ASSETS
from specviz.models.presets import GGUF_SOURCE
from specviz.training.distill_data import load_data, split_heldout, without_evaluation_prompts

DEFAULT = [ASSETS / "models" / name for name in ("smollm2-draft-s", "smollm2-draft-m", "smollm2-head-v1", "smollm2-head")]


def predictor(path: Path, target):
    """seq (1, L), n -> the drafter's greedy guesses for seq[n:], each from the true tokens before it."""
    if not is_feature_head(path):
        draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return lambda seq, n: draft(seq).logits[0, n - 1:-1].argmax(-1)
    head, vocab = load_head(path, target, torch.float32)
    vocab = torch.tensor(vocab)
    rows = target.lm_head.weight[vocab]

    def guess(seq, n):  # the head at i reads the target's states at i and token i+1, and guesses token i+2
        _, outputs = layer_outputs(target, head.taps, input_ids=seq)
        states = head.state(tap_states(outputs, head.taps, target))
        out = head(states[:, :-1], F.embedding(seq[:, 1:], target.model.embed_tokens.weight))[0, n - 2:-1]
        return vocab[(out @ rows.T).argmax(-1)]
    return guess


@torch.inference_mode()
def main(dirs: list[Path]) -> None:
    tok = load_tokenizer(GGUF_SOURCE)
    target = load_model(GGUF_SOURCE, dtype=torch.float32).model
    groups: dict[str, list] = {}
    for item in load_suite("all"):
        text = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt").input_ids
        groups.setdefault(item["category"], []).append((ids.shape[1], target.generate(ids, do_sample=False, max_new_tokens=64)))
    items = without_evaluation_prompts(load_data(ASSETS / "distill" / "data"), tok)
    held, _ = split_heldout(items)
    # held-out answers are greedy, so each answer token is the target's top-1 there
    groups["distillation held-out"] = [(len(p), torch.tensor([list(p) + list(a)], dtype=torch.long)) for p, a, _, _ in held]
    suites = [name for name in groups if name != "distillation held-out"]
    print("| draft | " + " | ".join(suites) + " | all 48 suite prompts | distillation held-out |")
    print("|---" * (len(suites) + 3) + "|")
    for path in dirs:
        guess = predictor(path, target)
        counts = {name: (sum(int((guess(seq, n) == seq[0, n:]).sum()) for n, seq in group), sum(seq.shape[1] - n for n, seq in group))
                  for name, group in groups.items()}
        counts["all"] = tuple(sum(counts[name][i] for name in suites) for i in (0, 1))
        cells = [f"{counts[name][0] / counts[name][1]:.3f}" for name in suites]
        cells += [f"{counts[name][0] / counts[name][1]:.3f} ({counts[name][1]} tokens)" for name in ("all", "distillation held-out")]
        print(f"| {path.name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or DEFAULT)
