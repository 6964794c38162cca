"""Top-1 agreement of draft models (and feature heads) with the offline target, teacher-forced on the target's
own greedy answers.

    .venv/bin/python scripts/draft_agreement.py [DRAFT_DIR ...]    # default: the bundled drafts and head

Two measures per draft: on the evaluation suites (2 prompts per category, 64 new tokens, chat template) and on
the distillation data's held-out answers (the split ``specviz.training.drafts fit`` reports). Older drafts can be
compared by restoring them from git, e.g. ``git archive 3c1a678 assets/models | tar -x -C /tmp/old``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from specviz.analysis.suites import load_suite
from specviz.methods.feature_head import is_feature_head, load_head
from specviz.models.loading import load_model, load_tokenizer
from specviz.models.paths import ASSETS
from specviz.models.presets import GGUF_SOURCE
from specviz.training.drafts import load_data, split_heldout, without_evaluation_prompts

DEFAULT = [ASSETS / "models" / name for name in ("smollm2-draft-s", "smollm2-draft-m", "smollm2-head")]


def predictor(path: Path, target):
    """seq (1, L), n -> the drafter's greedy guesses for seq[n:], each from the true tokens before it."""
    if not is_feature_head(path):
        draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return lambda seq, n: draft(seq).logits[0, n - 1:-1].argmax(-1)
    head, vocab = load_head(path, target, torch.float32)
    vocab = torch.tensor(vocab)
    rows = target.lm_head.weight[vocab]

    def guess(seq, n):  # the head at i reads the target's state at i and token i+1, and guesses token i+2
        states = target.model(input_ids=seq).last_hidden_state
        out = head(states[:, :-1], F.embedding(seq[:, 1:], target.model.embed_tokens.weight))[0, n - 2:-1]
        return vocab[(out @ rows.T).argmax(-1)]
    return guess


@torch.inference_mode()
def main(dirs: list[Path]) -> None:
    tok = load_tokenizer(GGUF_SOURCE)
    target = load_model(GGUF_SOURCE, dtype=torch.float32).model
    answers = []
    for item in load_suite("all", 2):
        text = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt").input_ids
        answers.append((ids.shape[1], target.generate(ids, do_sample=False, max_new_tokens=64)))
    items = without_evaluation_prompts(load_data(ASSETS / "distill" / "data"), tok)
    held, _ = split_heldout(items)
    # held-out answers are greedy, so each answer token is the target's top-1 there
    held_seqs = [(len(p), torch.tensor([list(p) + list(a)], dtype=torch.long)) for p, a, _, _ in held]
    print("| draft | suite agreement (tokens) | distillation held-out agreement (tokens) |\n|---|---|---|")
    for path in dirs:
        guess = predictor(path, target)
        measured = [(sum(int((guess(seq, n) == seq[0, n:]).sum()) for n, seq in group), sum(seq.shape[1] - n for n, seq in group))
                    for group in (answers, held_seqs)]
        print(f"| {path.name} | " + " | ".join(f"{a / t:.3f} ({t})" for a, t in measured) + " |", flush=True)


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or DEFAULT)
