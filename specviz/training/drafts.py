"""Distil small draft models from the offline target.

    python -m specviz.training.drafts data --prompts 3000      # target answers + top-k probs -> assets/distill/data
    python -m specviz.training.drafts fit --width 64 --layers 2 --out assets/models/smollm2-draft-s
    python -m specviz.training.drafts vocab --size 16384 --out assets/models/smollm2-draft-s   # frequent-token head
    python -m specviz.training.feature_head fit --out assets/models/smollm2-head   # the feature-level head

Recipe: instructions are built from ``assets/distill/recipe.json`` (templates x topics, arithmetic word
problems, code tasks and snippets, summaries of the target's own earlier answers, and slot-filled families
of everyday questions, rewrites and creative tasks) with a seeded RNG; the target
answers them greedily in batches through its chat template, and at every answer position we keep its
top-k next-token probabilities (:mod:`specviz.training.distill_data`). A draft is a standard
``LlamaForCausalLM`` whose tied embedding is initialised from the target's embedding projected on its top
principal directions, trained with a distillation loss (cross-entropy against the target's renormalised
top-k distribution) on answer positions only. The evaluation suites in ``assets/prompts`` are never used.

``vocab`` ranks token ids by the target's top-k probability mass over the training answers and writes the
most frequent ones to ``draft_vocab.json`` in a draft's directory: the engine's lean forward then projects
the draft's last hidden state onto those rows of its output matrix only (as in FR-Spec), since for a draft
of a few million parameters the 49,152-row projection is most of a forward.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specviz.models.loading import load_model, load_tokenizer
from specviz.models.paths import ASSETS
from specviz.models.presets import GGUF_SOURCE
from specviz.training.distill_data import generate_data, load_data, split_heldout, without_evaluation_prompts
from specviz.training.draft_vocab import write_draft_vocab


def make_draft(width: int, layers: int, heads: int, target) -> torch.nn.Module:
    """A small Llama with the target's vocabulary and a PCA-projected copy of its embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    config = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=tc.max_position_embeddings,
                         rope_parameters=tc.rope_parameters, rms_norm_eps=tc.rms_norm_eps, tie_word_embeddings=True,
                         bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id)
    draft = LlamaForCausalLM(config)
    emb = target.get_input_embeddings().weight.detach().float()
    _, _, v = torch.linalg.svd(emb - emb.mean(0), full_matrices=False)
    proj = emb @ v[:width].T
    draft.get_input_embeddings().weight.data.copy_(proj)
    return draft


def _batches(items, batch: int, rng: random.Random):
    order = list(range(len(items)))
    rng.shuffle(order)
    for i in range(0, len(order) - batch + 1, batch):
        yield [items[j] for j in order[i:i + batch]]


def _collate(rows, max_len: int, pad: int):
    """Token matrix, and for every position predicting an answer token: the target's top-k ids and probs."""
    k = rows[0][2].shape[1]
    seqs, tids, tps = [], [], []
    for prompt, answer, top_ids, top_p in rows:
        seq = np.concatenate([prompt, answer])[:max_len + 1]
        ids = np.zeros((len(seq) - 1, k), np.int64)
        ps = np.zeros((len(seq) - 1, k), np.float32)
        a0 = len(prompt) - 1  # position whose next token is answer[0]
        n = max(0, min(len(answer), len(seq) - 1 - a0))
        ids[a0:a0 + n], ps[a0:a0 + n] = top_ids[:n], top_p[:n]
        seqs.append(seq), tids.append(ids), tps.append(ps)
    length = max(len(s) for s in seqs) - 1
    x = torch.full((len(rows), length), pad, dtype=torch.long)
    ti = torch.zeros((len(rows), length, k), dtype=torch.long)
    tp = torch.zeros((len(rows), length, k))
    for r, (s, i, p) in enumerate(zip(seqs, tids, tps)):
        x[r, :len(s) - 1] = torch.from_numpy(s[:-1].astype(np.int64))
        ti[r, :len(i)], tp[r, :len(p)] = torch.from_numpy(i), torch.from_numpy(p)
    return x, ti, tp


def distill_loss(draft, x: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the target's renormalised top-k distribution, over answer positions only
    (the vocabulary projection, most of the cost, runs on those positions alone)."""
    mask = top_p.sum(-1) > 0
    hidden = draft.model(input_ids=x).last_hidden_state[mask]
    logp = draft.lm_head(hidden).float().log_softmax(-1).gather(-1, top_ids[mask])
    target = top_p[mask] / top_p[mask].sum(-1, keepdim=True)
    return -(target * logp).sum(-1).mean()


def fit(data: Path, out: Path, width: int, layers: int, heads: int, epochs: float, batch: int, lr: float, max_len: int,
        seed: int, minutes: float) -> None:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = load_tokenizer(GGUF_SOURCE)
    held, train = split_heldout(without_evaluation_prompts(load_data(data), tok))
    if len(train) < batch:
        raise SystemExit(f"{len(train)} training answers in {data}: fewer than one batch of {batch}; generate more with `data`")
    target = load_model(GGUF_SOURCE, dtype=torch.float32).model
    draft = make_draft(width, layers, heads, target)
    del target
    n_tokens = sum(len(a) for _, a, _, _ in train)
    steps = max(1, int(epochs * len(train) / batch))
    print(f"{len(train)} answers, {n_tokens} answer tokens; {sum(p.numel() for p in draft.parameters())} params; {steps} steps", flush=True)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    start, step = time.time(), 0

    def lr_scale(s: int) -> float:
        # cosine over whichever budget runs out first, so a time-capped run still anneals
        progress = min(1.0, max(s / steps, (time.time() - start) / (max(minutes, 1e-6) * 60)))
        return min(1.0, (s + 1) / warmup) * (1 + math.cos(math.pi * progress)) / 2

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_scale)
    while step < steps and (time.time() - start) < minutes * 60:
        for rows in _batches(train, batch, rng):
            x, ti, tp = _collate(rows, max_len, tok.pad_token_id)
            loss = distill_loss(draft, x, ti, tp)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % 10 == 0:
                print(f"step {step}/{steps} loss {loss.item():.3f} {time.time() - start:.0f}s", flush=True)
            if step >= steps or (time.time() - start) >= minutes * 60:
                break
    report = evaluate_draft(draft, held, tok.pad_token_id)
    minutes_used = (time.time() - start) / 60
    report.update(width=width, layers=layers, steps=step, train_answers=len(train), train_tokens=n_tokens, minutes=minutes_used)
    out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.bfloat16).save_pretrained(out)
    (out / "specviz.json").write_text(json.dumps({"target": "smollm2-offline", "tokenizer": "target", "training": report}, indent=1))
    print(json.dumps(report), flush=True)


@torch.inference_mode()
def evaluate_draft(draft: torch.nn.Module, held, pad: int) -> dict:
    """Top-1 agreement with the target's greedy token on held-out answers (the greedy acceptance rate)."""
    agree = total = 0
    for i in range(0, len(held), 8):
        x, ti, tp = _collate(held[i:i + 8], 1024, pad)
        mask = tp.sum(-1) > 0
        pred = draft(x).logits.argmax(-1)
        agree += (pred[mask] == ti[..., 0][mask]).sum().item()
        total += mask.sum().item()
    return {"heldout_top1_agreement": agree / max(total, 1), "heldout_tokens": total}


def _trainer(sub, name: str, help: str, minutes: float, batch: int, lr: float) -> argparse.ArgumentParser:
    """A training subcommand with the options every trainer takes."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--data", type=Path, default=ASSETS / "distill" / "data")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=minutes)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specviz.training.drafts", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="generate the target's answers and top-k probabilities")
    d.add_argument("--out", type=Path, default=ASSETS / "distill" / "data")
    d.add_argument("--prompts", type=int, default=3000)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--max-new-tokens", type=int, default=160)
    d.add_argument("--topk", type=int, default=8)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the target's dtype while answering")
    d.add_argument("--self-instruct", type=float, default=0.0, help="share of each shard asking instructions the target wrote")
    d.add_argument("--multi-turn", type=float, default=0.0, help="share of each shard following up an earlier answer")
    f = _trainer(sub, "fit", "train one draft on the generated data", minutes=60, batch=16, lr=3e-3)
    f.add_argument("--width", type=int, default=64)
    f.add_argument("--layers", type=int, default=2)
    f.add_argument("--heads", type=int, default=4)
    f.add_argument("--epochs", type=float, default=3)
    v = sub.add_parser("vocab", help="write the draft vocabulary (most frequent target tokens) next to drafts")
    v.add_argument("--data", type=Path, default=ASSETS / "distill" / "data")
    v.add_argument("--out", type=Path, nargs="+", required=True, help="draft directories")
    v.add_argument("--size", type=int, default=16384)
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if a.cmd == "data":
        generate_data(a.out, a.prompts, a.batch, a.max_new_tokens, a.topk, a.seed, getattr(torch, a.dtype), a.self_instruct, a.multi_turn)
    elif a.cmd == "vocab":
        print(json.dumps(write_draft_vocab(a.data, a.out, a.size)))
    else:
        fit(a.data, a.out, a.width, a.layers, a.heads, a.epochs, a.batch, a.lr, a.max_len, a.seed, a.minutes)


if __name__ == "__main__":
    sys.exit(main())
