"""The draft models' distillation data: instructions built from ``assets/distill/recipe.json`` (or written by the
target itself and cleaned), the target's greedy answers with their top-k next-token probabilities saved in shards,
their loading and the held-out split. No evaluation prompt is asked; ``python -m specviz.training.drafts data``
runs :func:`generate_data`."""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from specviz.analysis.suites import evaluation_texts
from specviz.models.loading import load_model, load_tokenizer
from specviz.models.paths import ASSETS
from specviz.models.presets import GGUF_SOURCE

RECIPE = ASSETS / "distill" / "recipe.json"

SAMPLED = (0.9, 0.95)
"""Temperature and top-p of what the target writes sampled (its self-written instructions)."""


def build_instructions(n: int, seed: int, passages: list[str] = (), fresh: Callable[[str], bool] = lambda text: True) -> list[str]:
    """``n`` varied instructions from the recipe for which ``fresh`` holds; ``passages`` feed the summary templates."""
    recipe = json.loads(RECIPE.read_text())
    held_out = evaluation_texts()
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.10:
            a, b = rng.randint(2, 40), rng.randint(2, 12)
            text = rng.choice(recipe["math_templates"]).format(name=rng.choice(recipe["names"]), a=a, b=b, c=a + rng.randint(5, 60))
        elif kind < 0.18:
            text = rng.choice(recipe["code_templates"]).format(task=rng.choice(recipe["code_tasks"]))
        elif kind < 0.24:
            text = rng.choice(recipe["snippet_templates"]).format(snippet=rng.choice(recipe["code_snippets"]))
        elif kind < 0.32 and passages:
            text = rng.choice(recipe["summary_templates"]).format(passage=rng.choice(passages))
        elif kind < 0.66:
            family = rng.choice(recipe["families"])
            text = rng.choice(family["templates"]).format(**{k: rng.choice(v) for k, v in family["slots"].items()})
        else:
            topic, topic2 = rng.sample(recipe["topics"], 2)
            text = rng.choice(recipe["templates"]).format(topic=topic, topic2=topic2)
        if text.strip() not in held_out and fresh(text):
            out.append(text)
    return out


def without_evaluation_prompts(items: list, tok) -> list:
    """Drop answers whose instruction is an evaluation prompt (shards made before the recipe excluded them)."""
    held_out = evaluation_texts()

    def leaked(prompt_ids) -> bool:
        text = tok.decode(prompt_ids.tolist(), skip_special_tokens=True)
        return any(h in text for h in held_out)

    return [item for item in items if not leaked(item[0])]


class TopKRecorder:
    """A logits processor that keeps the target's top-k next-token probabilities at every step."""

    def __init__(self, k: int):
        self.k, self.ids, self.probs = k, [], []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = scores.float().softmax(-1).topk(self.k, dim=-1)
        self.ids.append(top.indices.to(torch.int32))
        self.probs.append(top.values.to(torch.float16))
        return scores


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def near_evaluation(text: str, held_out: list[frozenset[str]], overlap: float = 0.5) -> bool:
    """Whether ``text`` shares at least ``overlap`` of its words (Jaccard) with an evaluation prompt: an
    instruction the target wrote itself must not paraphrase a prompt the benchmarks score."""
    words = _words(text)
    return any(len(words & h) >= overlap * len(words | h) for h in held_out)


def clean_instruction(text: str) -> str | None:
    """The first line of what the target wrote when asked for an instruction, without quotes or a label; None
    if it is too short or too long to be one."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"^(\d+[.)]|question:|instruction:|prompt:|problem:|request:)\s*", "", line.strip(), flags=re.I).strip(' "*')
    return line if 15 <= len(line) <= 240 else None


def generate_data(out: Path, n_prompts: int, batch: int, max_new: int, k: int, seed: int,
                  dtype: torch.dtype = torch.float32, self_instruct: float = 0.0, multi_turn: float = 0.0) -> None:
    """Greedy answers of the target to ``n_prompts`` conversations, saved in shards as they finish. A bf16
    target answers faster in large batches on CPUs with native bf16 matmuls; its answers are the target's
    greedy text up to rounding, which is all the feature head needs (it learns from fp32 states recomputed on them).

    A share ``self_instruct`` of each shard asks instructions the target wrote itself (sampled, seeded, from the
    recipe's ``self_instruct_templates``; dropped when near an evaluation prompt) and a share ``multi_turn``
    continues an earlier answer of this run with one of the recipe's ``follow_ups``."""
    from transformers import LogitsProcessorList

    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(GGUF_SOURCE)
    target = load_model(GGUF_SOURCE, dtype=dtype).model
    recipe = json.loads(RECIPE.read_text())
    held_out = [_words(t) for t in evaluation_texts()]
    passages: list[str] = []
    exchanges: list[list[dict]] = []  # earlier (instruction, answer) pairs of this run, for follow-ups
    done = len(list(out.glob("shard-*.npz")))
    asked = {prompt_key(p) for p, *_ in load_data(out)}

    def chat(messages: list[dict]) -> str:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def fresh(messages: list[dict] | str) -> bool:  # templates repeat: an instruction already answered teaches nothing new
        messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
        key = prompt_key(tok(chat(messages)).input_ids)
        if key in asked:
            return False
        asked.add(key)
        return True

    def answer(messages: list[list[dict]], new_tokens: int, topk: int = 0, sample: bool = False):
        enc = tok([chat(m) for m in messages], return_tensors="pt", padding=True, padding_side="left")
        rec = TopKRecorder(max(topk, 1))
        with torch.inference_mode():
            temperature, top_p = SAMPLED if sample else (None, None)
            seqs = target.generate(**enc, do_sample=sample, temperature=temperature, top_p=top_p, top_k=None,
                                   max_new_tokens=new_tokens, logits_processor=LogitsProcessorList([rec]), pad_token_id=tok.pad_token_id)
        gen, rows = seqs[:, enc.input_ids.shape[1]:].tolist(), []
        for r, g in enumerate(gen):
            n = g.index(tok.eos_token_id) + 1 if tok.eos_token_id in g else len(g)
            rows.append((enc.input_ids[r][enc.attention_mask[r].bool()].tolist(), g[:n], r))
        return rows, torch.stack(rec.ids, 1), torch.stack(rec.probs, 1)

    def self_written(n: int, rng: random.Random) -> list[list[dict]]:
        asks = [[{"role": "user", "content": rng.choice(recipe["self_instruct_templates"]).format(topic=rng.choice(recipe["topics"]))}]
                for _ in range(n)]
        written = [clean_instruction(tok.decode(g, skip_special_tokens=True)) for _, g, _ in answer(asks, 48, sample=True)[0]]
        return [[{"role": "user", "content": w}] for w in written if w and not near_evaluation(w, held_out) and fresh(w)]

    def follow_ups(n: int, rng: random.Random) -> list[list[dict]]:
        if not exchanges:
            return []
        picked = [rng.choice(exchanges) + [{"role": "user", "content": rng.choice(recipe["follow_ups"])}] for _ in range(n)]
        return [m for m in picked if fresh(m)]

    start = time.time()
    for shard in range(done, math.ceil(n_prompts / batch)):
        rng = random.Random(seed * 100_003 + shard)
        torch.manual_seed(seed * 100_003 + shard)
        chunk = self_written(round(self_instruct * batch), rng) + follow_ups(round(multi_turn * batch), rng)
        chunk += [[{"role": "user", "content": t}] for t in build_instructions(batch - len(chunk), seed * 100_003 + shard, passages, fresh)]
        rows, top_ids, top_p = answer(chunk, max_new, k)
        saved = []
        for prompt_ids, g, r in rows:
            saved.append((prompt_ids, g, top_ids[r, :len(g)].numpy(), top_p[r, :len(g)].numpy()))
            text = tok.decode(g, skip_special_tokens=True)
            if 200 < len(text) < 900:
                passages.append(text)
            if len(chunk[r]) == 1 and 40 < len(text) < 1200:
                exchanges.append(chunk[r] + [{"role": "assistant", "content": text}])
        partial = out / f"partial-{shard:04d}.npz"  # renamed when complete: stopping the run never leaves half a shard
        np.savez_compressed(partial,
                            prompt=np.array([np.array(r[0], np.int32) for r in saved], dtype=object),
                            answer=np.array([np.array(r[1], np.int32) for r in saved], dtype=object),
                            top_ids=np.array([r[2] for r in saved], dtype=object),
                            top_p=np.array([r[3] for r in saved], dtype=object))
        partial.rename(out / f"shard-{shard:04d}.npz")
        tokens = sum(len(r[1]) for r in saved)
        print(f"shard {shard}: {len(saved)} answers, {tokens} tokens, {time.time() - start:.0f}s", flush=True)


def prompt_key(prompt_ids) -> bytes:
    """What identifies an instruction across shards: its chat-formatted prompt ids."""
    return np.asarray(prompt_ids, np.int64).tobytes()


def load_data(path: Path) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(prompt, answer, top-k ids, top-k probs) per answer, each instruction once: templates repeat, and a
    held-out answer whose twin is in the training set would measure memory, not agreement."""
    items, seen = [], set()
    for shard in sorted(path.glob("shard-*.npz")):
        d = np.load(shard, allow_pickle=True)
        for item in zip(d["prompt"], d["answer"], d["top_ids"], d["top_p"]):
            key = prompt_key(item[0])
            if key not in seen:
                seen.add(key)
                items.append(item)
    return items


def split_heldout(items: list) -> tuple[list, list]:
    """The first 2 % of the answers (at least 8, at most 30) are held out from training and from the draft
    vocabulary; the cap keeps the held-out set fixed as later data rounds add answers."""
    n = min(30, max(8, len(items) // 50))
    return items[:n], items[n:]
