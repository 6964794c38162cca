"""Judge head: token labels, features from pre-norm states, training, AUC, persistence and the CLI."""

import itertools
import re
from types import SimpleNamespace

import pytest
import torch

from specviz.cli import Parser
from specviz.core.errors import ConfigError, ModelLoadError
from specviz.core.hidden import prenorm_states
from specviz.methods.judge import JudgeHead, JudgeLoadError, default_head_path
from specviz.models.paths import ASSETS
from specviz.training.judge_cli import read_dataset, register, run
from specviz.training.judge_fit import (
    build_features,
    evaluate,
    fit_logistic,
    fold,
    item_labels,
    report_markdown,
    roc_auc,
    sample_weights,
    standardise,
    token_kinds,
    token_labels,
    train_head,
)


class WordTokenizer:
    """Words with their leading whitespace, ids from a fixed hash, BOS = 1, no chat template."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        spans = [m.span() for m in re.finditer(r"\s*\S+", text)]
        ids = [sum(map(ord, text[a:b])) % 90 + 5 for a, b in spans]
        return SimpleNamespace(input_ids=[1] * add_special_tokens + ids, offset_mapping=spans)


ANSWER = "a bb ccc dd"  # tokens "a" (0,1) " bb" (1,4) " ccc" (4,8) " dd" (8,11)


@pytest.mark.parametrize("error_at, labels", [(None, [1, 1, 1, 1]), (5, [1, 1, 0]), (4, [1, 1, 0]), (7, [1, 1, 0]),
                                              (3, [1, 0]), (0, [0]), (10, [1, 1, 1, 0])])
def test_token_labels_mark_the_first_error_and_drop_the_rest(error_at, labels):
    ids, start, got = token_labels(WordTokenizer(), "q one", ANSWER, error_at)
    assert start == 3 and len(ids) == start + 4 and got == labels
    assert ids[:start] == WordTokenizer()("q one").input_ids


@pytest.mark.slow
def test_token_labels_with_the_offline_tokenizer(bank):
    from specviz.models.presets import OFFLINE_PRESET, resolve_preset

    tok = bank.tokenizer(resolve_preset(OFFLINE_PRESET).target)
    answer = "So 17 + 25 = 43, which is odd."
    ids, start, labels = token_labels(tok, "What is 17 + 25?", answer, answer.index("43"))
    assert labels[:-1] == [1] * (len(labels) - 1) and labels[-1] == 0
    kept = tok.decode(ids[start:start + len(labels) - 1])
    assert answer.startswith(kept) and len(kept) <= answer.index("43") and "4" in tok.decode(ids[start + len(labels) - 1])
    assert tok.decode(ids[:start]).rstrip().endswith("assistant")  # chat template applied


@pytest.mark.slow
def test_junk_items_label_the_junk_token_with_the_offline_tokenizer(bank):
    """Every draft-junk item keeps its base answer's tokens before the junk and labels the junk token 0;
    "<|im_end|>" / "<|endoftext|>" become the special ids."""
    import json

    from specviz.models.presets import OFFLINE_PRESET, resolve_preset
    from specviz.training import judge_data as jd
    from specviz.training import judge_junk as jj

    tok = bank.tokenizer(resolve_preset(OFFLINE_PRESET).target)
    specials = {tok.convert_tokens_to_ids(s) for s in jj.SPECIALS}
    assert specials == {tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")} and len(specials) == 2
    rows = [json.loads(line) for line in (jd.OUT_DIR / "dataset.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rows}
    junk = [r for r in rows if r["source"] == "junk"]
    assert junk
    for r in junk:
        ids, start, labels = token_labels(tok, r["question"], r["answer"], r["error_at"])
        assert labels[-1] == 0 and all(labels[:-1]), r
        base = by_id[r["id"].rsplit("-junk-", 1)[0]]
        k = len(labels) - 1
        assert ids[start:start + k] == tok(base["answer"], add_special_tokens=False).input_ids[:k], r
        if r["answer"][r["error_at"]:] in jj.SPECIALS:
            assert ids[start + k] in specials, r


def _items():
    return [{"id": "a", "category": "x", "question": "q one", "answer": ANSWER, "error_at": 5, "split": "train"},
            {"id": "b", "category": "y", "question": "another q", "answer": "all fine here", "error_at": None, "split": "heldout"}]


def test_features_are_prenorm_states_at_the_answer_tokens(tiny_target):
    tok, items = WordTokenizer(), _items()
    feats = build_features(tiny_target, tok, items)
    assert feats["X"].shape == (6, 64 + 2) and feats["X"].dtype == torch.float32
    assert feats["y"].tolist() == [1, 1, 0, 1, 1, 1] and feats["item"].tolist() == [0, 0, 0, 1, 1, 1]
    assert feats["split"] == ["train"] * 3 + ["heldout"] * 3 and feats["sources"] == ["", ""]
    assert feats["target"] == tiny_target.name and feats["hidden_size"] == 64
    ids, start, labels = token_labels(tok, items[0]["question"], ANSWER, 5)
    full = prenorm_states(tiny_target.model, ids)  # the dropped token after the error changes nothing before it
    torch.testing.assert_close(feats["X"][:3, :64], full[start:start + 3])
    # the confidence columns: log p of each answer token and the top log p, from the row that predicted it
    with torch.inference_mode():
        logp = tiny_target.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    rows = torch.arange(start - 1, start + 2)
    answer = torch.tensor(ids[start:start + 3])
    torch.testing.assert_close(feats["X"][:3, 64], logp[rows, answer], atol=1e-4, rtol=0)
    torch.testing.assert_close(feats["X"][:3, 65], logp[rows].max(-1).values, atol=1e-4, rtol=0)


def test_a_decision_labels_only_its_last_token_and_weighs_as_told(tiny_target):
    tok = WordTokenizer()
    decision = {"id": "d", "category": "x", "question": "q one", "answer": "a bb", "answer_ids": [7, 8, 9], "label": 0,
                "split": "train", "source": "decision"}
    ids, start, labels = item_labels(tok, decision)
    assert ids == tok("q one").input_ids + [7, 8, 9] and start == len(ids) - 1 and labels == [0]
    feats = build_features(tiny_target, tok, [*_items(), {**decision, "error_at": None}])
    assert feats["y"].tolist() == [1, 1, 0, 1, 1, 1, 0] and feats["item"].tolist()[-1] == 2
    torch.testing.assert_close(feats["X"][-1, :64], prenorm_states(tiny_target.model, ids)[-1])
    kinds = token_kinds(feats, feats["item"])
    assert kinds == ["content"] * 6 + ["decision"]
    assert sample_weights(kinds, feats["y"], 2.0, 3.0).tolist() == [1, 1, 1, 1, 1, 1, 3]


def _separable(n, seed, neg_rate=0.1):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 12, generator=gen) * torch.linspace(0.1, 30, 12) + 7.0  # far from standardised
    direction = torch.linspace(-1, 1, 12) / torch.linspace(0.1, 30, 12)
    margin = (X - 7.0) @ direction
    y = (margin > torch.quantile(margin, neg_rate)).float()
    return X, y


def test_training_recovers_a_separable_problem_with_imbalance():
    X, y = _separable(3000, 0)
    head = train_head(X, y, target="toy")
    Xt, yt = _separable(2000, 1)
    metrics = evaluate(head, Xt, yt)
    assert metrics["auc"] > 0.95 and metrics["negative_detection"]["recall"] > 0.8
    assert head.meta["tokens"] == 3000 and head.meta["negatives"] == int((y == 0).sum())


def test_sample_weights_of_junk_first_errors():
    feats = {"item_ids": ["a-001-0", "a-001-0-junk-eos", "b-002-1-junk-loop"], "sources": ["template", "junk", "junk"]}
    item, y = torch.tensor([0, 0, 1, 1, 2]), torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    kinds = token_kinds(feats, item)
    assert kinds == ["content", "content", "junk:eos", "junk:eos", "junk:loop"]
    assert token_kinds({"item_ids": feats["item_ids"]}, item) == kinds  # older features: from the ids
    assert sample_weights(kinds, y, 3.0).tolist() == [1.0, 1.0, 1.0, 3.0, 3.0]


def test_sample_weight_shifts_the_head_towards_rejection():
    X, y = _separable(800, 4, neg_rate=0.2)
    X = X + torch.randn(X.shape, generator=torch.Generator().manual_seed(5)) * 8  # overlapping classes
    Z, _, _ = standardise(X)
    plain = fit_logistic(Z, y, l2=0.1, epochs=100, seed=0)
    ones = fit_logistic(Z, y, l2=0.1, epochs=100, seed=0, sample_weight=torch.ones(len(y)))
    torch.testing.assert_close(plain[0], ones[0])
    assert plain[1] == pytest.approx(ones[1])
    heavy = train_head(X, y, l2=0.1, epochs=100, sample_weight=torch.where(y < 0.5, 3.0, 1.0))
    light = train_head(X, y, l2=0.1, epochs=100)
    assert (heavy.score(X) > 0.5).float().mean() < (light.score(X) > 0.5).float().mean()


def test_folding_the_standardisation_is_exact():
    X, y = _separable(500, 2, neg_rate=0.3)
    Z, mean, std = standardise(X)
    w, b = fit_logistic(Z, y, l2=1e-2, epochs=100, seed=0)
    raw_w, raw_b = fold(w, b, mean, std)
    torch.testing.assert_close(X.double() @ raw_w + raw_b, Z @ w + b)
    head = train_head(X, y, l2=1e-2, epochs=100, seed=0)
    torch.testing.assert_close(head.score(X), torch.sigmoid(Z @ w + b).float(), atol=1e-5, rtol=0)


def test_auc_by_hand_and_with_ties():
    assert roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.75)
    assert roc_auc(torch.tensor([0.5, 0.5, 0.2, 0.9]), torch.tensor([1, 0, 0, 1])) == pytest.approx(0.875)
    assert roc_auc(torch.full((4,), 0.3), torch.tensor([1, 0, 1, 0])) == pytest.approx(0.5)
    assert roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1])) != roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))  # NaN
    gen = torch.Generator().manual_seed(0)
    s, y = torch.randint(0, 5, (40,), generator=gen).float(), torch.randint(0, 2, (40,), generator=gen)
    pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for (a, la), (b, lb) in itertools.product(zip(s, y), repeat=2) if la and not lb]
    assert roc_auc(s, y) == pytest.approx(sum(pairs) / len(pairs))


def _head(hidden=8, target="toy"):
    return JudgeHead(torch.linspace(-1, 1, hidden), 0.25, target, hidden, {"tokens": 3})


def test_score_has_hidden_plus_one_parameters_and_takes_any_dtype():
    head = _head(64)
    assert head.n_parameters == 65
    states = torch.randn(5, 64)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        s = head.score(states.to(dtype))
        assert s.shape == (5,) and s.dtype == torch.float32 and ((0 <= s) & (s <= 1)).all()
    torch.testing.assert_close(head.score(states), torch.sigmoid(states @ head.weight + 0.25))


def test_save_load_round_trip(tmp_path):
    head, path = _head(), tmp_path / "judge.json"
    head.save(path)
    back = JudgeHead.load(path, "toy", 8)
    assert torch.equal(back.weight, head.weight) and back.bias == head.bias and back.meta == head.meta
    states = torch.randn(3, 8)
    assert torch.equal(back.score(states), head.score(states))


def test_confidence_head_reads_two_more_columns_and_round_trips(tmp_path):
    head = JudgeHead(torch.linspace(-1, 1, 10), 0.1, "toy", 8, confidence=True)
    assert head.n_parameters == 11 and head.columns(torch.zeros(4, 12)).shape == (4, 10)
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [1.0, 3.0, 0.0]])
    x = head.inputs(torch.zeros(3, 8), logits, torch.tensor([0, 2, 0]))
    logp = logits.log_softmax(-1)
    torch.testing.assert_close(x[:, 8], logp[[0, 1, 2], [0, 2, 0]])
    torch.testing.assert_close(x[:, 9], logp.max(-1).values)
    head.save(tmp_path / "j.json")
    back = JudgeHead.load(tmp_path / "j.json", "toy", 8)
    assert back.confidence and torch.equal(back.score(x), head.score(x))
    (tmp_path / "j.json").write_text((tmp_path / "j.json").read_text().replace('"confidence": true', '"confidence": false'))
    with pytest.raises(JudgeLoadError, match="hidden_size"):
        JudgeHead.load(tmp_path / "j.json", "toy", 8)


@pytest.mark.parametrize("target, hidden, content, fragment", [
    ("other", 8, None, "trained for target 'toy', not 'other'"),
    ("toy", 16, None, "expects hidden size 8"),
    ("toy", 8, "{not json", "unreadable"),
    ("toy", 8, '{"format": "specviz-judge-head/1", "target": "toy", "hidden_size": 8, "bias": 0, "meta": {}, "weight": [1, 2]}',
     "unreadable"),
])
def test_load_refuses_other_targets_and_broken_files(tmp_path, target, hidden, content, fragment):
    path = tmp_path / "judge.json"
    _head().save(path)
    if content is not None:
        path.write_text(content)
    with pytest.raises(JudgeLoadError, match=re.escape(fragment)) as err:
        JudgeHead.load(path, target, hidden)
    assert "\n" not in str(err.value) and isinstance(err.value, ModelLoadError)


def test_load_names_the_missing_file(tmp_path):
    with pytest.raises(JudgeLoadError, match="no judge head for 'toy'"):
        JudgeHead.load(tmp_path / "missing.json", "toy", 8)


def test_default_head_path_is_a_slug_under_assets():
    assert default_head_path("SmolLM2-135M-Instruct.Q4_1.gguf") == ASSETS / "judges" / "smollm2-135m-instruct-q4-1-gguf.json"


def test_evaluate_counts_and_report():
    head = JudgeHead(torch.tensor([1.0]), 0.0, "toy", 1)
    X, y = torch.tensor([[-3.0], [-1.0], [2.0], [4.0], [0.5]]), torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0])
    m = evaluate(head, X, y, threshold=0.5)  # accepted: 2.0, 4.0, 0.5 -> tp 2, fp 1, fn 1, tn 1
    assert (m["tokens"], m["positives"], m["negatives"]) == (5, 3, 2)
    assert m["acceptance"]["precision"] == pytest.approx(2 / 3) and m["acceptance"]["recall"] == pytest.approx(2 / 3)
    assert m["negative_detection"]["precision"] == pytest.approx(0.5) and m["negative_detection"]["recall"] == pytest.approx(0.5)
    assert m["accuracy"] == pytest.approx(0.6) and sum(b["count"] for b in m["calibration"]) == 5
    text = report_markdown(m)
    assert "ROC AUC" in text and text.count("\n| 0.") + text.count("\n| 1.") >= 10
    assert "by_kind" not in m and "By kind" not in text


def test_evaluate_by_kind_of_first_error():
    head = JudgeHead(torch.tensor([1.0]), 0.0, "toy", 1)
    X = torch.tensor([[-3.0], [-1.0], [2.0], [4.0], [0.5], [1.0], [-2.0], [3.0]])
    y = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    kinds = ["content"] * 5 + ["junk:eos"] * 2 + ["junk:loop"]  # the junk positive (1.0) is not compared
    m = evaluate(head, X, y, 0.5, kinds)
    rows = {k["kind"]: k for k in m["by_kind"]}
    assert list(rows) == ["content", "junk", "junk:eos", "junk:loop"]
    assert rows["content"]["negatives"] == 2 and rows["content"]["auc"] == pytest.approx(5 / 6)
    assert rows["content"]["accepted"] == pytest.approx(0.5)
    assert rows["junk"]["negatives"] == 2 and rows["junk"]["auc"] == pytest.approx(4 / 6) and rows["junk"]["accepted"] == 0.5
    assert rows["junk:eos"]["auc"] == pytest.approx(1.0) and rows["junk:loop"]["accepted"] == 1.0
    text = report_markdown(m)
    assert "By kind of first error" in text and "| junk:loop | 1 | 0.333 | 1.000 |" in text


def _cli(*argv):
    ap = Parser(prog="python -m specviz")
    register(ap.add_subparsers(dest="command", required=True, parser_class=Parser))
    return run(ap.parse_args(["judge", *argv]))


def test_cli_train_and_eval_on_saved_features(tmp_path):
    X, y = _separable(600, 3)
    feats = {"X": X, "y": y, "item": torch.arange(600) // 20, "split": ["train"] * 400 + ["heldout"] * 200,
             "item_ids": [str(i) for i in range(30)], "categories": ["c"] * 30, "target": "toy", "hidden_size": 10,
             "chat": True, "dataset": "toy.jsonl"}  # columns 10 and 11 stand for the two confidence features
    torch.save(feats, tmp_path / "f.pt")
    head, report = tmp_path / "head.json", tmp_path / "eval.md"
    assert _cli("train", "--features", str(tmp_path / "f.pt"), "--out", str(head), "--no-confidence") == 0
    assert not JudgeHead.load(head, "toy", 10).confidence and JudgeHead.load(head, "toy", 10).n_parameters == 11
    assert _cli("train", "--features", str(tmp_path / "f.pt"), "--out", str(head)) == 0
    assert JudgeHead.load(head, "toy", 10).meta["items"] == 20 and JudgeHead.load(head, "toy", 10).n_parameters == 13
    assert _cli("eval", "--features", str(tmp_path / "f.pt"), "--head", str(head), "--out", str(report)) == 0
    assert "ROC AUC" in report.read_text() and "200 held-out tokens" in report.read_text()
    feats["target"] = "another"
    torch.save(feats, tmp_path / "g.pt")
    with pytest.raises(JudgeLoadError, match="trained for target 'toy'"):
        _cli("eval", "--features", str(tmp_path / "g.pt"), "--head", str(head), "--out", str(report))
    with pytest.raises(ConfigError, match="judge build"):
        _cli("train", "--features", str(tmp_path / "missing.pt"))
    feats["hidden_size"] = 12  # features built before the confidence columns existed
    torch.save(feats, tmp_path / "old.pt")
    with pytest.raises(ConfigError, match="no confidence features"):
        _cli("train", "--features", str(tmp_path / "old.pt"))


@pytest.mark.parametrize("line, fragment", [
    ("not json", "line 1: not JSON"),
    ('{"id": "a"}', "missing or mistyped"),
    ('{"id": "a", "category": "c", "question": "q", "answer": "ab", "error_at": 2, "split": "train", "source": "s"}', "error_at"),
    ('{"id": "a", "category": "c", "question": "q", "answer": "ab", "error_at": null, "split": "dev", "source": "s"}', "split"),
    ('{"id": "a", "category": "c", "question": "q", "answer": "a", "answer_ids": [], "label": 1, "split": "train", "source": "decision"}',
     "answer_ids"),
    ('{"id": "a", "category": "c", "question": "q", "answer": "a", "answer_ids": [4], "label": 2, "split": "train", "source": "d"}',
     "label of 0 or 1"),
])
def test_dataset_rows_are_checked(tmp_path, line, fragment):
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=fragment):
        read_dataset(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_dataset(tmp_path / "none.jsonl")
