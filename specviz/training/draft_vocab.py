"""A draft's vocabulary: the token ids its lean forward scores (FR-Spec), ranked by the target's top-k probability
mass over the distillation answers and written to ``draft_vocab.json`` in the draft's directory
(``python -m specviz.training.drafts vocab``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specviz.models.loading import DRAFT_VOCAB_FILE, load_tokenizer
from specviz.models.presets import GGUF_SOURCE
from specviz.training.distill_data import load_data, split_heldout, without_evaluation_prompts


def rank_tokens(items: list) -> list[int]:
    """Token ids by the target's top-k probability mass at answer positions, most frequent first."""
    pairs = [(np.asarray(ids, np.int64).reshape(-1), np.asarray(probs, np.float64).reshape(-1)) for _, _, ids, probs in items]
    mass = np.zeros(1 + max(int(ids.max()) for ids, _ in pairs))
    for ids, probs in pairs:
        np.add.at(mass, ids, probs)
    order = np.argsort(-mass, kind="stable")
    return order[mass[order] > 0].tolist()


def write_draft_vocab(data: Path, outs: list[Path], size: int) -> dict:
    """Rank tokens on the training answers, measure how many held-out answer tokens the top ``size`` cover,
    and write the ids (ascending) to each draft directory."""
    tok = load_tokenizer(GGUF_SOURCE)
    held, train = split_heldout(without_evaluation_prompts(load_data(data), tok))
    chosen = rank_tokens(train)[:size]
    if len(chosen) < size:
        raise SystemExit(f"only {len(chosen)} distinct tokens in the top-k data of {data}; choose --size <= {len(chosen)}")
    held_tokens = np.concatenate([np.asarray(answer, np.int64) for _, answer, _, _ in held])
    report = {"size": size, "ranked_by": f"the target's top-k probability mass over {sum(len(a) for _, a, _, _ in train)} "
                                        f"answer positions of {len(train)} training answers",
              "heldout_coverage": float(np.isin(held_tokens, chosen).mean()), "heldout_tokens": len(held_tokens)}
    for out in outs:
        (out / DRAFT_VOCAB_FILE).write_text(json.dumps({**report, "ids": sorted(chosen)}))
    return report
