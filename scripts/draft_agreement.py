"""Top-1 agreement of draft models with the offline target, teacher-forced on the target's own greedy answers.

    .venv/bin/python scripts/draft_agreement.py [DRAFT_DIR ...]    # default: the bundled drafts

Two measures per draft: on the evaluation suites (2 prompts per category, 64 new tokens, chat template) and on
the distillation data's held-out answers (the split ``specviz.train fit`` reports). Older drafts can be
compared by restoring them from git, e.g. ``git archive 3c1a678 assets/models | tar -x -C /tmp/old``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from specviz.models import ASSETS, GGUF_SOURCE, load_model, load_tokenizer
from specviz.suites import load_suite
from specviz.train import _collate, load_data, split_heldout, without_evaluation_prompts

DEFAULT = [ASSETS / "models" / "smollm2-draft-s", ASSETS / "models" / "smollm2-draft-m"]


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
    print("| draft | suite agreement (tokens) | distillation held-out agreement (tokens) |\n|---|---|---|")
    for path in dirs:
        draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        agree = sum(int((draft(seq).logits[0, n - 1:-1].argmax(-1) == seq[0, n:]).sum()) for n, seq in answers)
        total = sum(seq.shape[1] - n for n, seq in answers)
        h_agree = h_total = 0
        for i in range(0, len(held), 8):
            x, top_ids, top_p = _collate(held[i:i + 8], 1024, tok.pad_token_id)
            mask = top_p.sum(-1) > 0
            h_agree += int((draft(x).logits.argmax(-1)[mask] == top_ids[..., 0][mask]).sum())
            h_total += int(mask.sum())
        print(f"| {path} | {agree / total:.3f} ({total}) | {h_agree / h_total:.3f} ({h_total}) |", flush=True)


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or DEFAULT)
