"""Draft distillation on tiny random Llamas: collation, loss, PCA init, agreement, training and the instruction recipe."""

import json
import random
import re
import string
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specviz.models.loaded import LoadedModel
from specviz.training import distill_data, draft_vocab
from specviz.training import drafts as train
from specviz.training.distill_data import build_instructions, load_data, split_heldout
from specviz.training.drafts import _batches, _collate, distill_loss, evaluate_draft, make_draft
from tests.conftest import tiny_llama

K = 4


def row(prompt, answer, top_ids, top_p):
    return (np.array(prompt, np.int32), np.array(answer, np.int32), np.array(top_ids, np.int32), np.array(top_p, np.float16))


# ---- TopKRecorder ---------------------------------------------------------------------------------------------


def test_recorder_keeps_sorted_top_k_and_its_top_1_is_the_greedy_token(teacher_data):
    for _, answer, ids, probs in teacher_data:
        assert ids.shape == probs.shape == (len(answer), K)
        assert ids[:, 0].tolist() == answer.tolist()
        p = probs.astype(np.float32)
        assert np.all(np.diff(p, axis=1) <= 0) and np.all(p > 0) and np.all(p.sum(1) <= 1.001)


# ---- _collate -------------------------------------------------------------------------------------------------


def test_collate_puts_top_k_on_the_positions_predicting_answer_tokens():
    rows = [row([1, 2, 3], [4, 5], [[4, 9], [5, 8]], [[0.5, 0.25], [0.75, 0.125]]),
            row([7], [8, 9, 10], [[8, 1], [9, 2], [10, 3]], [[0.5, 0.5], [0.25, 0.125], [1.0, 0.0]])]
    x, ti, tp = _collate(rows, max_len=100, pad=0)
    assert x.tolist() == [[1, 2, 3, 4], [7, 8, 9, 0]]
    assert ti.shape == (2, 4, 2) and tp.shape == (2, 4, 2)
    # row 0: position 2 (token 3) predicts answer[0]=4, position 3 predicts answer[1]=5; the prompt positions carry nothing
    assert ti[0].tolist() == [[0, 0], [0, 0], [4, 9], [5, 8]]
    assert tp[0].tolist() == [[0, 0], [0, 0], [0.5, 0.25], [0.75, 0.125]]
    # row 1: a one-token prompt labels from position 0; the padded position carries nothing
    assert ti[1].tolist() == [[8, 1], [9, 2], [10, 3], [0, 0]]
    assert tp[1].tolist() == [[0.5, 0.5], [0.25, 0.125], [1.0, 0.0], [0, 0]]


def test_collate_truncates_at_max_len():
    rows = [row([1, 2, 3], [4, 5, 6], [[4], [5], [6]], [[0.5], [0.5], [0.5]]),
            row([1, 2, 3, 4, 5, 6], [7, 8], [[7], [8]], [[0.5], [0.5]])]
    x, ti, tp = _collate(rows, max_len=4, pad=0)
    assert x.tolist() == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert ti[0, :, 0].tolist() == [0, 0, 4, 5] and tp[0, :, 0].tolist() == [0, 0, 0.5, 0.5]
    assert tp[1].abs().sum() == 0  # the prompt alone is longer than max_len: no answer position survives
    x, ti, tp = _collate(rows[:1], max_len=3, pad=0)  # exactly the prompt plus the first answer token
    assert x.tolist() == [[1, 2, 3]] and ti[0, :, 0].tolist() == [0, 0, 4]


@pytest.mark.parametrize("max_len", [3, 6, 9, 40])
def test_collate_labels_match_the_next_token_everywhere(teacher_data, max_len):
    x, ti, tp = _collate(teacher_data, max_len=max_len, pad=0)
    for r, (prompt, answer, _, probs) in enumerate(teacher_data):
        seq = np.concatenate([prompt, answer])[:max_len + 1]
        labelled = (tp[r].sum(-1) > 0).nonzero().flatten().tolist()
        assert labelled == list(range(len(prompt) - 1, len(seq) - 1))
        assert x[r, :len(seq) - 1].tolist() == seq[:-1].tolist()
        for t in labelled:
            assert ti[r, t, 0] == seq[t + 1]
            assert tp[r, t].tolist() == pytest.approx(probs[t - len(prompt) + 1].astype(np.float32).tolist())


# ---- distill_loss ---------------------------------------------------------------------------------------------


def test_distill_loss_matches_a_hand_computation_over_answer_positions_only():
    draft = tiny_llama(vocab=12, hidden=16, layers=1, seed=5, init_std=0.5).model
    rows = [row([1, 2, 3], [4, 5], [[4, 9, 1], [5, 8, 2]], [[0.5, 0.25, 0.125], [0.75, 0.125, 0.0625]]),
            row([7, 6], [8], [[8, 1, 0]], [[0.25, 0.25, 0.25]])]
    x, ti, tp = _collate(rows, max_len=100, pad=11)
    with torch.no_grad():
        logp = draft(x).logits.float().log_softmax(-1)
        terms = []
        for r, (prompt, answer, ids, probs) in enumerate(rows):
            for j in range(len(answer)):
                t = len(prompt) - 1 + j
                p = probs[j].astype(np.float64) / probs[j].astype(np.float64).sum()
                terms.append(-sum(p[i] * logp[r, t, ids[j][i]].item() for i in range(3)))
        loss = distill_loss(draft, x, ti, tp).item()
    assert len(terms) == 3
    assert loss == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    # the target is renormalised: scaling the stored probabilities changes nothing
    assert distill_loss(draft, x, ti, 0.5 * tp).item() == pytest.approx(loss, rel=1e-5)


def test_distill_loss_ignores_prompt_and_padding_tokens_after_the_answer():
    draft = tiny_llama(vocab=12, hidden=16, layers=1, seed=5, init_std=0.5).model
    x, ti, tp = _collate([row([1, 2, 3], [4, 5], [[4, 9], [5, 8]], [[0.5, 0.25], [0.75, 0.125]]),
                          row([7, 6], [8], [[8, 1]], [[0.5, 0.5]])], max_len=100, pad=11)
    with torch.no_grad():
        base = distill_loss(draft, x, ti, tp).item()
        x2 = x.clone()
        x2[1, 2:] = 3  # the padding after row 1's answer: causal, so it cannot change any answer position
        assert distill_loss(draft, x2, ti, tp).item() == pytest.approx(base, rel=1e-6)
        x3 = x.clone()
        x3[0, 0] = 9  # a prompt token does change the answer positions' context
        assert distill_loss(draft, x3, ti, tp).item() != pytest.approx(base, rel=1e-6)


# ---- make_draft -----------------------------------------------------------------------------------------------


def test_make_draft_copies_a_pca_projection_of_the_target_embedding(tiny_target):
    target = tiny_target.model
    emb = target.get_input_embeddings().weight.detach().double()
    draft = make_draft(16, 1, 2, target)
    assert draft.config.vocab_size == target.config.vocab_size and draft.config.hidden_size == 16
    proj = draft.get_input_embeddings().weight.detach().double()
    assert proj.shape == (target.config.vocab_size, 16)
    assert draft.lm_head.weight.data_ptr() == draft.get_input_embeddings().weight.data_ptr()  # tied, so the head is PCA'd too
    variances = proj.var(0)
    assert torch.all(variances[:-1] >= variances[1:] - 1e-9)  # first principal direction first
    top = torch.linalg.eigvalsh(torch.cov(emb.T)).flip(0)[:16]
    assert variances.tolist() == pytest.approx(top.tolist(), rel=1e-4)
    # and the directions are the embedding's: projecting onto the 16 largest leaves the least residual
    centered = proj - proj.mean(0)
    q = torch.linalg.qr(torch.randn(emb.shape[1], 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    assert centered.pow(2).sum() > ((emb - emb.mean(0)) @ q).pow(2).sum()


def test_make_draft_at_full_width_is_a_rotation_of_the_embedding(tiny_target):
    target = tiny_target.model
    emb = target.get_input_embeddings().weight.detach().double()
    proj = make_draft(target.config.hidden_size, 1, 2, target).get_input_embeddings().weight.detach().double()
    assert torch.allclose(proj @ proj.T, emb @ emb.T, atol=1e-4)


# ---- evaluate_draft -------------------------------------------------------------------------------------------


class NextIsPlusOne(torch.nn.Module):
    """A 'draft' whose greedy prediction after token t is always t + 1."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, x):
        return SimpleNamespace(logits=torch.nn.functional.one_hot((x + 1) % self.vocab, self.vocab).float())


def test_evaluate_draft_counts_top_1_agreement_on_answer_positions():
    held = [row([1, 2], [3, 4, 9], [[3, 0], [4, 0], [9, 0]], [[0.9, 0.1]] * 3),  # 3 and 4 agree, 9 does not
            row([5], [6, 0], [[6, 1], [0, 7]], [[0.9, 0.1]] * 2)]  # 6 agrees, 0 does not (7 would)
    assert evaluate_draft(NextIsPlusOne(12), held, pad=11) == {"heldout_top1_agreement": pytest.approx(3 / 5), "heldout_tokens": 5}
    many = held * 5  # more than one batch of 8
    assert evaluate_draft(NextIsPlusOne(12), many, pad=11) == {"heldout_top1_agreement": pytest.approx(3 / 5), "heldout_tokens": 25}


def test_the_target_agrees_with_itself(teacher, teacher_data):
    report = evaluate_draft(teacher.model, teacher_data, pad=0)
    assert report == {"heldout_top1_agreement": 1.0, "heldout_tokens": sum(len(a) for _, a, _, _ in teacher_data)}


# ---- training -------------------------------------------------------------------------------------------------


def _full_loss(draft, items):
    with torch.no_grad():
        return distill_loss(draft, *_collate(items, 64, 0)).item()


def test_a_few_steps_of_distillation_reduce_the_loss_and_raise_agreement(teacher, teacher_data):
    torch.manual_seed(0)
    draft = make_draft(16, 1, 2, teacher.model)
    before, agree_before = _full_loss(draft, teacher_data), evaluate_draft(draft, teacher_data, 0)["heldout_top1_agreement"]
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-2)
    rng = random.Random(0)
    for _ in range(9):
        for rows in _batches(teacher_data, 8, rng):
            loss = distill_loss(draft, *_collate(rows, 64, 0))
            opt.zero_grad()
            loss.backward()
            opt.step()
    after, agree_after = _full_loss(draft, teacher_data), evaluate_draft(draft, teacher_data, 0)["heldout_top1_agreement"]
    assert after < 0.6 * before
    assert agree_after > agree_before + 0.1


def test_batches_are_a_shuffled_partition_without_the_ragged_tail():
    batches = list(_batches(list(range(10)), 3, random.Random(0)))
    assert [len(b) for b in batches] == [3, 3, 3]
    flat = [i for b in batches for i in b]
    assert len(set(flat)) == 9 and flat != sorted(flat)


def _write_shards(folder: Path, items, per_shard):
    """Shards in ``generate_data``'s format (object arrays; all answers of a shard have the same length here)."""
    folder.mkdir()
    for s in range(0, len(items), per_shard):
        chunk = items[s:s + per_shard]
        np.savez_compressed(folder / f"shard-{s // per_shard:04d}.npz",
                            prompt=np.array([r[0] for r in chunk], dtype=object), answer=np.array([r[1] for r in chunk], dtype=object),
                            top_ids=np.array([r[2] for r in chunk], dtype=object), top_p=np.array([r[3] for r in chunk], dtype=object))


def test_load_data_reads_shards_back_in_order(tmp_path, teacher_data):
    _write_shards(tmp_path / "data", teacher_data, per_shard=10)
    items = load_data(tmp_path / "data")
    assert len(items) == len(teacher_data)
    for got, want in zip(items, teacher_data):
        for a, b in zip(got, want):
            assert np.asarray(a).astype(np.float64).tolist() == b.astype(np.float64).tolist()
    for got, want in zip(_collate(items[:8], 64, 0), _collate(teacher_data[:8], 64, 0)):  # object arrays collate like typed ones
        assert torch.equal(got, want)


def test_load_data_keeps_each_instruction_once(tmp_path, teacher_data):
    twin = (teacher_data[3][0], teacher_data[5][1], teacher_data[5][2], teacher_data[5][3])  # a repeated prompt
    _write_shards(tmp_path / "data", [*teacher_data[:8], twin, *teacher_data[8:]], per_shard=10)
    items = load_data(tmp_path / "data")
    assert len(items) == len(teacher_data)
    assert [np.asarray(i[1]).tolist() for i in items] == [a.tolist() for _, a, _, _ in teacher_data]  # the first kept


def test_the_held_out_split_is_capped_so_later_data_rounds_keep_it():
    assert [len(split_heldout(list(range(n)))[0]) for n in (10, 500, 1533, 5000)] == [8, 10, 30, 30]


def test_fit_end_to_end_with_a_tiny_target(tmp_path, monkeypatch, teacher, teacher_data):
    from transformers import LlamaForCausalLM

    _write_shards(tmp_path / "data", teacher_data, per_shard=8)
    monkeypatch.setattr(train, "load_model", lambda source, dtype=None: LoadedModel("tiny", teacher.model, 48))
    monkeypatch.setattr(train, "load_tokenizer", lambda source: SimpleNamespace(pad_token_id=0, decode=lambda ids, **kw: ""))
    train.fit(tmp_path / "data", tmp_path / "draft", width=16, layers=1, heads=2, epochs=4, batch=4, lr=1e-2, max_len=64, seed=0,
              minutes=1)
    meta = json.loads((tmp_path / "draft" / "specviz.json").read_text())
    report = meta["training"]
    held, rest = teacher_data[:8], teacher_data[8:]  # the first max(8, n // 50) answers are held out
    assert report["steps"] == int(4 * len(rest) / 4) == 16
    assert report["train_answers"] == len(rest) and report["train_tokens"] == sum(len(a) for _, a, _, _ in rest)
    assert report["heldout_tokens"] == sum(len(a) for _, a, _, _ in held)
    assert 0 <= report["heldout_top1_agreement"] <= 1
    saved = LlamaForCausalLM.from_pretrained(tmp_path / "draft")
    assert saved.dtype == torch.bfloat16 and saved.config.hidden_size == 16 and saved.config.vocab_size == 48


def test_rank_tokens_orders_ids_by_top_k_probability_mass():
    items = [row([1], [5, 6], [[5, 2], [6, 5]], [[0.5, 0.25], [0.5, 0.25]]), row([1], [7], [[7, 2]], [[0.875, 0.125]])]
    assert draft_vocab.rank_tokens(items) == [7, 5, 6, 2]  # mass 0.875, 0.75, 0.5, 0.375; id 0 and others never appear


def test_draft_vocab_is_ranked_without_the_held_out_answers_and_reports_their_coverage(tmp_path, monkeypatch, teacher_data):
    from specviz.models.loading import read_draft_vocab

    _write_shards(tmp_path / "data", teacher_data, per_shard=8)
    monkeypatch.setattr(draft_vocab, "load_tokenizer", lambda source: SimpleNamespace(pad_token_id=0, decode=lambda ids, **kw: ""))
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        out.mkdir()
    report = draft_vocab.write_draft_vocab(tmp_path / "data", outs, size=10)
    held, rest = teacher_data[:8], teacher_data[8:]
    chosen = draft_vocab.rank_tokens(rest)[:10]
    held_tokens = [t for _, a, _, _ in held for t in a.tolist()]
    assert report["heldout_coverage"] == pytest.approx(sum(t in chosen for t in held_tokens) / len(held_tokens))
    assert read_draft_vocab(outs[0]) == read_draft_vocab(outs[1]) == sorted(chosen)
    with pytest.raises(SystemExit, match="distinct tokens"):
        draft_vocab.write_draft_vocab(tmp_path / "data", outs, size=10_000)


# ---- build_instructions ---------------------------------------------------------------------------------------


def _eval_prompts():
    files = sorted(Path(train.ASSETS / "prompts").glob("*.jsonl"))
    assert len(files) >= 6
    return {json.loads(line)["prompt"].strip() for f in files for line in f.read_text().splitlines() if line.strip()}


def test_build_instructions_is_deterministic_per_seed():
    a = build_instructions(200, seed=3)
    assert len(a) == 200 and all(isinstance(s, str) and s for s in a)
    assert a == build_instructions(200, seed=3)
    assert a != build_instructions(200, seed=4)
    assert len(set(a)) > 150  # varied, not one template repeated


def test_build_instructions_uses_passages_only_when_given():
    passage = "A PASSAGE THAT CANNOT OCCUR IN THE RECIPE."
    with_passages = build_instructions(300, seed=1, passages=[passage])
    assert 0 < sum(passage in s for s in with_passages) < 300
    assert not any(passage in s for s in build_instructions(300, seed=1))


def test_build_instructions_keeps_only_fresh_instructions():
    answered = set(build_instructions(300, seed=2))
    asked = []

    def fresh(text):
        asked.append(text)
        return text not in answered

    out = build_instructions(300, seed=2, fresh=fresh)
    assert len(out) == 300 and not answered & set(out)
    assert len(asked) > 300  # the draws it refused were replaced, not dropped


def _pattern(template):
    """A regex matching what ``template.format(...)`` can produce; a field used twice must repeat its value."""
    out, seen = "", set()
    for literal, name, _, _ in string.Formatter().parse(template):
        out += re.escape(literal)
        if name:
            out += f"(?P={name})" if name in seen else f"(?P<{name}>" + (r"\d+)" if name in "abc" else ".+?)")
            seen.add(name)
    return re.compile(out + "$", re.S)


def _valid_math(f, recipe):
    a, b, c = (int(f[k]) if k in f else None for k in "abc")
    return ((a is None or 2 <= a <= 40) and (b is None or 2 <= b <= 12) and (c is None or a is None or 5 <= c - a <= 60)
            and f.get("name", recipe["names"][0]) in recipe["names"])  # "gave away a of c" never goes negative


@pytest.mark.parametrize("passages, expected", [
    (["First passage, long enough to summarise.", "Second passage."],
     {"math": 0.10, "code": 0.08, "snippet": 0.06, "summary": 0.08, "family": 0.34, "topic": 0.34}),
    ([], {"math": 0.10, "code": 0.08, "snippet": 0.06, "summary": 0.0, "family": 0.42, "topic": 0.34}),
])
def test_build_instructions_mixes_the_recipe_kinds_in_the_documented_shares(passages, expected):
    recipe = json.loads(distill_data.RECIPE.read_text())
    kinds = [("math", t, lambda f: _valid_math(f, recipe)) for t in recipe["math_templates"]]
    kinds += [("code", t, lambda f: f["task"] in recipe["code_tasks"]) for t in recipe["code_templates"]]
    kinds += [("snippet", t, lambda f: f["snippet"] in recipe["code_snippets"]) for t in recipe["snippet_templates"]]
    kinds += [("summary", t, lambda f: f["passage"] in passages) for t in recipe["summary_templates"]]
    kinds += [("topic", t, lambda f: all(f[k] in recipe["topics"] for k in ("topic", "topic2") if k in f)) for t in recipe["templates"]]
    kinds += [("family", t, lambda f, slots=family["slots"]: all(v in slots[k] for k, v in f.items()))
              for family in recipe["families"] for t in family["templates"]]
    patterns = [(kind, _pattern(t), valid) for kind, t, valid in kinds]
    counts = dict.fromkeys(expected, 0)
    for text in build_instructions(3000, seed=5, passages=passages):
        found = {kind for kind, p, valid in patterns if (m := p.match(text)) and valid(m.groupdict())}
        assert len(found) == 1, (text, found)
        counts[found.pop()] += 1
    assert {kind: n / 3000 for kind, n in counts.items()} == pytest.approx(expected, abs=0.03)


@pytest.mark.parametrize("n, seed", [
    (3000, 0),  # `train data` defaults: the code template x "reverses a string" is an evaluation prompt
])
def test_build_instructions_never_produces_an_evaluation_prompt(n, seed):
    suites = _eval_prompts() | {json.loads(line)["question"].strip() for line in
                                (train.ASSETS / "judge" / "eval_questions.jsonl").read_text().splitlines() if line.strip()}
    leaked = {s for s in build_instructions(n, seed) if s.strip() in suites}
    assert not leaked, leaked


def test_training_items_with_an_evaluation_prompt_are_dropped():
    decoded = {1: "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>", 2: "user: tell me about owls"}
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: decoded[ids[0]])
    items = [(np.array([1, 5]), "a"), (np.array([2, 5]), "b")]
    assert distill_data.without_evaluation_prompts(items, tok) == [items[1]]


def test_fit_refuses_less_than_one_batch_of_data(tmp_path, monkeypatch, teacher_data):
    _write_shards(tmp_path / "data", teacher_data[:10], per_shard=5)
    monkeypatch.setattr(train, "load_tokenizer", lambda source: SimpleNamespace(pad_token_id=0, decode=lambda ids, **kw: ""))
    with pytest.raises(SystemExit, match="fewer than one batch of 4"):
        train.fit(tmp_path / "data", tmp_path / "draft", width=16, layers=1, heads=2, epochs=4, batch=4, lr=1e-2, max_len=64,
                  seed=0, minutes=1)
