"""Train the feature-level draft head (``specviz.feature_head``) on the distillation data.

    python -m specviz.training.feature_head fit --out assets/models/smollm2-head --minutes 30

Recipe: the same target answers as the drafts (``specviz.training.drafts data``; held-out split shared). The target's
final-normed hidden states over every prompt+answer are computed once (fp32, cached under the specviz cache
directory). At every position i (prompt and answer), the head reads (f[i] plus a little Gaussian noise,
x[i+1]) and is trained to output f[i+1] (smooth-L1, as in EAGLE) and to match the target's own distribution
of x[i+2] over the draft vocabulary, which the target's LM head gives from f[i+1] (soft cross-entropy: the
labels are the target's predictions, not the text, so prompt positions teach the head too). A second,
unrolled pass feeds the head its own outputs instead of the target's states, as drafting does after the first
token. Held-out agreement is the top-1 match with the target at answer positions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specviz.methods.feature_head import FeatureHead, load_head, save_head
from specviz.models.loading import load_model, load_tokenizer
from specviz.models.paths import cache_dir
from specviz.models.presets import GGUF_SOURCE
from specviz.training.drafts import _trainer, load_data, rank_tokens, split_heldout, without_evaluation_prompts


def sequences(items: list, max_len: int) -> list[tuple[np.ndarray, int]]:
    """(prompt + answer ids truncated to ``max_len``, prompt length) per answer."""
    return [(np.concatenate([p, a]).astype(np.int64)[:max_len], len(p)) for p, a, _, _ in items]


def _key(ids: np.ndarray) -> str:
    return hashlib.sha1(ids.tobytes()).hexdigest()


@torch.inference_mode()
def target_features(target: torch.nn.Module, seqs: list[tuple[np.ndarray, int]], memo: Path, batch: int = 8) -> list[np.ndarray]:
    """The target's final-normed hidden state at every position of every sequence (fp16), computed once per
    sequence: ``memo`` keeps them by content, so a later data round only runs the new answers."""
    known = dict(np.load(memo, allow_pickle=True).item()) if memo.exists() else {}
    keys = [_key(ids) for ids, _ in seqs]
    missing = sorted((i for i, k in enumerate(keys) if k not in known), key=lambda i: len(seqs[i][0]))
    start = time.time()
    for b in range(0, len(missing), batch):
        rows = missing[b:b + batch]
        length = max(len(seqs[r][0]) for r in rows)
        x = torch.zeros((len(rows), length), dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, :len(seqs[r][0])] = torch.from_numpy(seqs[r][0])
        states = target.model(input_ids=x).last_hidden_state  # right padding: causal positions never see it
        for j, r in enumerate(rows):
            known[keys[r]] = states[j, :len(seqs[r][0])].to(torch.float16).numpy()
        if b // batch % 20 == 0:
            print(f"features {b + len(rows)}/{len(missing)} {time.time() - start:.0f}s", flush=True)
    if missing:
        memo.parent.mkdir(parents=True, exist_ok=True)
        np.save(memo, np.array(known, dtype=object), allow_pickle=True)
    return [known[k] for k in keys]


def _batch(seqs, feats, rows, answers_only: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids (B, T), features (B, T, H) and the mask of positions i scored (x[i+2] exists; with
    ``answers_only``, it is an answer token)."""
    length = max(len(seqs[r][0]) for r in rows)
    x = torch.zeros((len(rows), length), dtype=torch.long)
    f = torch.zeros((len(rows), length, feats[rows[0]].shape[1]))
    scored = torch.zeros((len(rows), length), dtype=torch.bool)
    for j, r in enumerate(rows):
        ids, prompt_len = seqs[r]
        x[j, :len(ids)], f[j, :len(ids)] = torch.from_numpy(ids), torch.from_numpy(feats[r].astype(np.float32))
        scored[j, max(prompt_len - 2, 0) if answers_only else 0:len(ids) - 2] = True
    return x, f, scored


def head_losses(head: FeatureHead, embed: torch.Tensor, vocab_rows: torch.Tensor, x: torch.Tensor, f: torch.Tensor,
                scored: torch.Tensor, unroll: int, noise: float = 0.0) -> tuple[torch.Tensor, list[float]]:
    """Summed loss over ``unroll`` passes, and each pass's top-1 agreement with the target.

    Pass k reads the head's own outputs of pass k-1 as features, so it predicts k+1 tokens ahead of the
    target's last state, as the k-th draft token does."""
    inputs, total, agreement = f[:, :-2], 0.0, []
    if noise:
        inputs = inputs + noise * torch.randn_like(inputs)
    for k in range(unroll):
        n = inputs.shape[1]
        pred = head(inputs, F.embedding(x[:, 1 + k:1 + k + n], embed))
        mask, truth = scored[:, k:k + n], f[:, 1 + k:1 + k + n]
        logits, teacher = pred[mask] @ vocab_rows.T, truth[mask] @ vocab_rows.T
        ce = -(teacher.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
        reg = F.smooth_l1_loss(pred[mask], truth[mask])
        total = total + (reg + 0.1 * ce) / (k + 1)
        agreement.append((logits.argmax(-1) == teacher.argmax(-1)).float().mean().item())
        inputs = pred[:, :-1]
    return total, agreement


def fit_head(data: Path, out: Path, vocab_size: int, minutes: float, batch: int, lr: float, max_len: int, unroll: int,
             noise: float, seed: int, init: Path | None = None) -> dict:
    """Train a head (from scratch, or on from the head in ``init``), save it to ``out`` and return its report."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = load_tokenizer(GGUF_SOURCE)
    held, train = split_heldout(without_evaluation_prompts(load_data(data), tok))
    target = load_model(GGUF_SOURCE, dtype=torch.float32).model
    seqs = sequences(held + train, max_len)
    feats = target_features(target, seqs, cache_dir() / "feature-head" / "features.npy")
    held_rows, train_rows = list(range(len(held))), list(range(len(held), len(seqs)))
    chosen = sorted(rank_tokens(train)[:vocab_size])
    embed = target.model.embed_tokens.weight.detach().float()
    vocab_rows = target.lm_head.weight.detach().float()[torch.tensor(chosen)]
    if init is not None:
        head = load_head(init, target, torch.float32)[0].train()
    else:
        head = FeatureHead(target.config)
        with torch.no_grad():  # start from "the next state is this state": the fc passes the feature half through
            head.fc.weight[:, embed.shape[1]:].add_(torch.eye(embed.shape[1]))
    params = [p for n, p in head.named_parameters() if not n.startswith("rotary.")]
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    start, step = time.time(), 0

    def lr_scale(s: int) -> float:
        progress = min(1.0, (time.time() - start) / (max(minutes, 1e-6) * 60))
        return min(1.0, (s + 1) / 50) * (0.05 + 0.95 * (1 + math.cos(math.pi * progress)) / 2)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_scale)
    print(f"{len(train_rows)} training answers, {n_params} head params", flush=True)
    while time.time() - start < minutes * 60:
        rng.shuffle(train_rows)
        for b in range(0, len(train_rows) - batch + 1, batch):
            x, f, scored = _batch(seqs, feats, train_rows[b:b + batch], answers_only=False)
            loss, agreement = head_losses(head, embed, vocab_rows, x, f, scored, unroll, noise)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % 10 == 0:
                print(f"step {step} loss {loss.item():.3f} agree {' '.join(f'{a:.2f}' for a in agreement)} "
                      f"{time.time() - start:.0f}s", flush=True)
            if time.time() - start >= minutes * 60:
                break
    with torch.no_grad():
        x, f, scored = _batch(seqs, feats, held_rows, answers_only=True)
        _, agreement = head_losses(head.eval(), embed, vocab_rows, x, f, scored, max(unroll, 2))
    report = {"heldout_top1_agreement": agreement, "steps": step, "minutes": (time.time() - start) / 60, "params": n_params,
              "train_answers": len(train_rows), "train_tokens": int(sum(len(train[i][1]) for i in range(len(train)))),
              "unroll": unroll, "noise": noise, "draft_vocab": vocab_size, "init": str(init) if init else None}
    save_head(head, out, "smollm2-offline", report, {"size": vocab_size, "ids": chosen})
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specviz.training.feature_head", description=__doc__.splitlines()[0])
    h = _trainer(ap.add_subparsers(dest="cmd", required=True), "fit", "train the head on the generated data", minutes=30, batch=8, lr=1e-3)
    h.add_argument("--vocab-size", type=int, default=8192)
    h.add_argument("--unroll", type=int, default=2, help="passes over the head's own outputs (1: teacher features only)")
    h.add_argument("--noise", type=float, default=0.05, help="std of the Gaussian noise added to the target's states")
    h.add_argument("--init", type=Path, help="continue training this head instead of starting from scratch")
    a = ap.parse_args(argv)
    print(json.dumps(fit_head(a.data, a.out, a.vocab_size, a.minutes, a.batch, a.lr, a.max_len, a.unroll, a.noise, a.seed, a.init)))


if __name__ == "__main__":
    main()
