"""Train a feature-level draft head (``specviz.methods.feature_head``) on the distillation data, EAGLE-3 style.

    python -m specviz.training.feature_head fit --taps 2 15 29 --init assets/models/smollm2-head-v1 --out DIR

Recipe: the target answers of ``specviz.training.drafts data`` (held-out split shared). Each batch runs the target
(no gradient) over prompt + answer to get the outputs of the tapped layers and its own distribution at every
position; nothing is cached, so a growing corpus costs nothing up front. The loss is the token loss alone: soft
cross-entropy between the head's distribution over the draft vocabulary and the target's (the labels are the
target's predictions, not the text, so prompt positions teach the head too).

Training-time test: the head is trained over ``--steps-ahead`` of its own successive drafts, exactly as it drafts.
Step 0 reads the target's states at every position; step k at position p reads the head's step-(k-1) output at
p-1 instead, and attends to the target-fed positions up to the root p-k and to its own positions p-k+1..p of steps
1..k, the keys drafting leaves in the head's cache. Step k's loss is weighted ``--step-weight``^k.

``--init`` starts from a saved head: its ``fc`` and layer are copied and, when it tapped only the last layer, the new
``fuse`` starts by passing that layer through, so training starts from what the old head drafts. Held-out
agreement (top-1 match with the target's own greedy token at answer positions, per drafting step) is measured every
``--eval-every`` training positions: the training curve in the report.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specviz.core.hidden import final_norm, layer_outputs
from specviz.methods.feature_head import FeatureHead, dequantize, load_head, quantize, save_head, tap_states
from specviz.models.loading import load_model, load_tokenizer
from specviz.models.presets import GGUF_SOURCE
from specviz.training.distill_data import load_data, split_heldout, without_evaluation_prompts
from specviz.training.draft_vocab import rank_tokens
from specviz.training.drafts import _trainer


def sequences(items: list, max_len: int) -> list[tuple[np.ndarray, int]]:
    """(prompt + answer ids truncated to ``max_len``, prompt length) per answer."""
    return [(np.concatenate([p, a]).astype(np.int64)[:max_len], len(p)) for p, a, _, _ in items]


def shared_prefix(seqs: list[tuple[np.ndarray, int]]) -> int:
    """How many leading tokens every prompt shares (the chat template's system turn): nothing to learn there."""
    first = seqs[0][0]
    n = min(p for _, p in seqs)
    for ids, _ in seqs[1:]:
        n = next((i for i in range(n) if ids[i] != first[i]), n)
    return n


def collate(seqs: list[tuple[np.ndarray, int]], rows: list[int], skip: int, answers_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, T) and the mask (B, T-1) of positions p scored: x[p+1] exists, p >= ``skip`` - 2 (the
    prediction of x[p+2] is past the shared prefix) and, with ``answers_only``, x[p+2] is an answer token."""
    length = max(len(seqs[r][0]) for r in rows)
    x = torch.zeros((len(rows), length), dtype=torch.long)
    scored = torch.zeros((len(rows), length - 1), dtype=torch.bool)
    for j, r in enumerate(rows):
        ids, prompt_len = seqs[r]
        x[j, :len(ids)] = torch.from_numpy(ids)
        scored[j, max(prompt_len if answers_only else skip, 2) - 2:len(ids) - 1] = True
    return x, scored


@torch.inference_mode()
def target_states(target: torch.nn.Module, x: torch.Tensor, taps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's input :func:`tap_states` (B, T, len(taps)·hidden) and the target's final-normed states (B, T,
    hidden), both float32, from one forward (right padding: causal positions never see it)."""
    last = target.config.num_hidden_layers - 1
    _, outputs = layer_outputs(target.model, tuple(sorted({*taps, last})), input_ids=x)
    return tap_states(outputs, taps, target).float(), final_norm(target)(outputs[last]).float()


def ttt_mask(n: int, step: int, device: torch.device) -> torch.Tensor:
    """Which keys a step-``step`` query at position p sees (n, (step+1)·n): step 0's keys up to p - step, and step
    j's key at p - step + j for j = 1..step (its own last)."""
    full = torch.ones(n, n, dtype=torch.bool, device=device)
    return torch.cat([full.tril(-step)] + [full.tril(j - step).triu(j - step) for j in range(1, step + 1)], 1)


def layer_step(head: FeatureHead, x: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]], step: int):
    """The head's decoder layer over one drafting step's inputs (B, n, hidden) at positions 0..n-1, attending to
    the keys and values of the earlier steps in ``past`` by :func:`ttt_mask`; its output and its keys and values."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    layer, (b, n, _) = head.layer, x.shape
    attn, d = layer.self_attn, head.layer.self_attn.head_dim
    h = layer.input_layernorm(x)
    q, k, v = (proj(h).view(b, n, -1, d).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    cos, sin = head.rotary(x, torch.arange(n, device=x.device)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = torch.cat([pk for pk, _ in past] + [k], 2), torch.cat([pv for _, pv in past] + [v], 2)
    y = F.scaled_dot_product_attention(q, keys, values, attn_mask=ttt_mask(n, step, x.device), enable_gqa=k.shape[1] != q.shape[1])
    x = x + attn.o_proj(y.transpose(1, 2).reshape(b, n, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x)), (k, v)


def ttt_outputs(head: FeatureHead, embed: torch.Tensor, x: torch.Tensor, tapped: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's outputs (B, T-1, hidden) at each of ``steps`` drafting steps: position p reads embed(x[p+1]) and,
    at step 0, the target's state at p; at step k, its own step-(k-1) output at p-1."""
    n = x.shape[1] - 1
    nexts = F.embedding(x[:, 1:], embed)
    state, past, outs = head.state(tapped[:, :n]), [], []
    for k in range(steps):
        out, kv = layer_step(head, head.fc(torch.cat([nexts, state], -1)), past, k)
        outs.append(out)
        state, past = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1), past + [kv]
    return outs


def ttt_losses(head: FeatureHead, embed: torch.Tensor, vocab_rows: torch.Tensor, x: torch.Tensor, tapped: torch.Tensor,
               normed: torch.Tensor, scored: torch.Tensor, steps: int, step_weight: float = 0.8,
               truth: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, list[float]]:
    """Weighted token loss over ``steps`` drafting steps (:func:`ttt_outputs`), and each step's top-1 agreement with
    the target: over the draft vocabulary, or with ``truth`` = (the draft vocabulary's ids, the target's argmax
    (B, T-1) over its whole vocabulary), the rate at which greedy drafting would be accepted.

    Position p predicts x[p+2], whose target distribution comes from ``normed[p+1]``."""
    teacher = normed[:, 1:] @ vocab_rows.T
    total, agreement = 0.0, []
    for k, out in enumerate(ttt_outputs(head, embed, x, tapped, steps)):
        mask = scored.clone()
        mask[:, :k] = False  # a step-k draft needs a root k positions back
        logits, labels = out[mask].float() @ vocab_rows.T, teacher[mask].softmax(-1)
        total = total + step_weight ** k * -(labels * logits.log_softmax(-1)).sum(-1).mean()
        picked = logits.argmax(-1)
        hits = picked == labels.argmax(-1) if truth is None else truth[0][picked] == truth[1][mask]
        agreement.append(hits.float().mean().item())
    return total / sum(step_weight ** k for k in range(steps)), agreement


def warm_start(head: FeatureHead, init: Path, target: torch.nn.Module) -> FeatureHead:
    """``head`` with the ``fc`` and layer of the head saved in ``init``; a new ``fuse`` passes through the tapped
    layers the old head read (concatenated in the same order), so the new head starts by drafting as the old one."""
    old = load_head(init, target, torch.float32)[0]
    head.fc.load_state_dict(old.fc.state_dict())
    head.layer.load_state_dict(old.layer.state_dict())
    if old.fuse is not None and old.taps == head.taps:
        head.fuse.load_state_dict(old.fuse.state_dict())
    elif head.fuse is not None:
        width = head.fc.in_features // 2
        with torch.no_grad():
            head.fuse.weight.zero_()
            for i, tap in enumerate(old.taps):
                j = head.taps.index(tap)
                block = torch.eye(width) if old.fuse is None else old.fuse.weight[:, i * width:(i + 1) * width]
                head.fuse.weight[:, j * width:(j + 1) * width] += block
    return head


def length_batches(rows: list[int], seqs, batch: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar lengths (less padding): sort each window of 32 batches by length."""
    rows = rows[:]
    rng.shuffle(rows)
    window = 32 * batch
    out = []
    for w in range(0, len(rows), window):
        chunk = sorted(rows[w:w + window], key=lambda r: len(seqs[r][0]))
        out += [chunk[b:b + batch] for b in range(0, len(chunk) - batch + 1, batch)]
    rng.shuffle(out)
    return out


def fit_head(data: Path, out: Path, taps: tuple[int, ...], vocab_size: int, minutes: float, batch: int, lr: float, max_len: int,
             steps_ahead: int, step_weight: float, seed: int, eval_every: int, init: Path | None = None,
             target_dtype: torch.dtype = torch.bfloat16, autocast: bool = False) -> dict:
    """Train a head (from scratch, or warm-started from ``init``), save it to ``out`` and return its report. With
    ``autocast``, the head's training forward and backward run in bfloat16 (its weights and optimiser stay float32)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = load_tokenizer(GGUF_SOURCE)
    held, train = split_heldout(without_evaluation_prompts(load_data(data), tok))
    target = load_model(GGUF_SOURCE, dtype=target_dtype).model
    seqs = sequences(held + train, max_len)
    skip = shared_prefix(seqs)
    held_rows, train_rows = list(range(len(held))), list(range(len(held), len(seqs)))
    chosen = sorted(rank_tokens(train)[:vocab_size])
    embed = target.model.embed_tokens.weight.detach().float()
    vocab_ids = torch.tensor(chosen)
    vocab_rows = target.lm_head.weight.detach().float()[vocab_ids]
    head = FeatureHead(target.config, taps)
    if init is not None:
        head = warm_start(head, init, target)
    head.train()
    params = [p for n, p in head.named_parameters() if not n.startswith("rotary.")]
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    held_x, held_scored = collate(seqs, held_rows, skip, answers_only=True)
    held_tapped, held_normed = target_states(target, held_x, head.taps)
    held_truth = (vocab_ids, target.lm_head(held_normed[:, 1:].to(target_dtype)).argmax(-1))

    def evaluate() -> list[float]:
        head.eval()
        with torch.no_grad():
            agreement = ttt_losses(head, embed, vocab_rows, held_x, held_tapped, held_normed, held_scored, steps_ahead,
                                   step_weight, held_truth)[1]
        head.train()
        return [round(a, 4) for a in agreement]

    start, step, seen, curve = time.time(), 0, 0, []
    curve.append({"positions": 0, "heldout_agreement": evaluate()})
    print(f"{len(train_rows)} training answers, {n_params} head params, taps {head.taps}; held-out {curve[-1]}", flush=True)

    def lr_scale(s: int) -> float:
        progress = min(1.0, (time.time() - start) / (max(minutes, 1e-6) * 60))
        return min(1.0, (s + 1) / 50) * (0.05 + 0.95 * (1 + math.cos(math.pi * progress)) / 2)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_scale)
    while time.time() - start < minutes * 60:
        for rows in length_batches(train_rows, seqs, batch, rng):
            x, scored = collate(seqs, rows, skip, answers_only=False)
            tapped, normed = target_states(target, x, head.taps)
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
                loss, agreement = ttt_losses(head, embed, vocab_rows, x, tapped, normed, scored, steps_ahead, step_weight)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step, seen = step + 1, seen + int(scored.sum())
            if step % 10 == 0:
                print(f"step {step} positions {seen} loss {loss.item():.3f} agree {' '.join(f'{a:.2f}' for a in agreement)} "
                      f"{time.time() - start:.0f}s", flush=True)
            if seen // eval_every > curve[-1]["positions"] // eval_every:
                curve.append({"positions": seen, "heldout_agreement": evaluate()})
                print(f"held-out {curve[-1]}", flush=True)
            if time.time() - start >= minutes * 60:
                break
    if curve[-1]["positions"] != seen:
        curve.append({"positions": seen, "heldout_agreement": evaluate()})
    trained = {k: v.clone() for k, v in head.state_dict().items()}
    head.load_state_dict(dequantize(quantize(trained)), strict=False)  # what the saved file will draft with
    stored = evaluate()
    head.load_state_dict(trained)
    report = {"heldout_top1_agreement": curve[-1]["heldout_agreement"], "heldout_top1_agreement_int8": stored, "curve": curve,
              "steps": step, "positions": seen,
              "minutes": round((time.time() - start) / 60, 2), "params": n_params, "taps": list(head.taps),
              "train_answers": len(train_rows), "train_tokens": int(sum(len(train[i][1]) for i in range(len(train)))),
              "steps_ahead": steps_ahead, "step_weight": step_weight, "draft_vocab": vocab_size, "lr": lr, "batch": batch,
              "autocast": autocast, "target_dtype": str(target_dtype).removeprefix("torch."), "init": str(init) if init else None}
    save_head(head, out, "smollm2-offline", report, {"size": vocab_size, "ids": chosen})
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specviz.training.feature_head", description=__doc__.splitlines()[0])
    h = _trainer(ap.add_subparsers(dest="cmd", required=True), "fit", "train the head on the generated data", minutes=30, batch=8, lr=5e-4)
    h.add_argument("--taps", type=int, nargs="+", default=[2, 15, 29], help="the target layers the head reads (0-based)")
    h.add_argument("--vocab-size", type=int, default=8192)
    h.add_argument("--steps-ahead", type=int, default=5, help="drafting steps trained (training-time test)")
    h.add_argument("--step-weight", type=float, default=0.8, help="step k's loss is weighted by this to the power k")
    h.add_argument("--eval-every", type=int, default=100_000, help="training positions between held-out evaluations")
    h.add_argument("--init", type=Path, help="start from this head's fc and layer instead of from scratch")
    h.add_argument("--target-dtype", choices=["float32", "bfloat16"], default="bfloat16", help="the target's dtype for its states")
    h.add_argument("--autocast", action="store_true", help="the head's forward and backward in bfloat16 (faster on CPUs with bf16)")
    a = ap.parse_args(argv)
    print(json.dumps(fit_head(a.data, a.out, tuple(a.taps), a.vocab_size, a.minutes, a.batch, a.lr, a.max_len, a.steps_ahead,
                              a.step_weight, a.seed, a.eval_every, a.init, getattr(torch, a.target_dtype), a.autocast)))


if __name__ == "__main__":
    main()
