"""Training the feature head on tiny random Llamas: the loss teaches agreement, features are computed once,
and ``fit_head`` writes a head the engine loads."""

import json
from types import SimpleNamespace

import numpy as np
import torch

from specviz.core.cache import LoadedModel
from specviz.methods.feature_head import FeatureHead, load_head
from specviz.training import feature_head as feature_train
from specviz.training.feature_head import _batch, head_losses, sequences, target_features
from tests.conftest import random_prompts, target_answers
from tests.test_train import _write_shards


def test_training_steps_raise_agreement_with_the_target(teacher, teacher_data, tmp_path):
    seqs = sequences(teacher_data, 64)
    feats = target_features(teacher.model, seqs, tmp_path / "f.npy")
    embed, rows = teacher.model.model.embed_tokens.weight.detach(), teacher.model.lm_head.weight.detach()
    torch.manual_seed(0)
    head = FeatureHead(teacher.model.config)
    x, f, scored = _batch(seqs, feats, list(range(len(seqs))), answers_only=False)
    _, before = head_losses(head, embed, rows, x, f, scored, unroll=2)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(60):
        loss, _ = head_losses(head, embed, rows, x, f, scored, unroll=2, noise=0.01)
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, after = head_losses(head, embed, rows, x, f, scored, unroll=2)
    assert after[0] > before[0] + 0.3 and after[1] > before[1] + 0.2


def test_answers_only_scores_positions_whose_next_next_token_is_an_answer_token():
    seqs = [(np.arange(10), 4), (np.arange(6), 3)]
    feats = [np.zeros((10, 2), np.float16), np.zeros((6, 2), np.float16)]
    _, _, answers = _batch(seqs, feats, [0, 1], answers_only=True)
    _, _, everything = _batch(seqs, feats, [0, 1], answers_only=False)
    assert answers[0].nonzero().flatten().tolist() == list(range(2, 8)) and answers[1].nonzero().flatten().tolist() == [1, 2, 3]
    assert everything[0].sum() == 8 and everything[1].sum() == 4  # every position with a token two ahead, no padding


def test_target_features_are_the_final_normed_states_and_are_kept(teacher, tmp_path):
    seqs = [(np.array(p, np.int64), 2) for p in random_prompts(5, 48, seed=1)]
    feats = target_features(teacher.model, seqs, tmp_path / "f.npy", batch=2)
    with torch.inference_mode():
        want = teacher.model.model(input_ids=torch.from_numpy(seqs[3][0])[None]).last_hidden_state[0]
    torch.testing.assert_close(torch.from_numpy(feats[3].astype(np.float32)), want, atol=2e-3, rtol=1e-2)
    again = target_features(None, seqs, tmp_path / "f.npy")  # read back, no target needed
    assert all(np.array_equal(a, b) for a, b in zip(feats, again))
    rows = []

    def counting(input_ids):
        rows.append(input_ids.shape[0])
        return teacher.model.model(input_ids=input_ids)

    extra = (np.array(random_prompts(1, 48, seed=9)[0], np.int64), 2)
    more = target_features(SimpleNamespace(model=counting), [extra, *seqs], tmp_path / "f.npy")  # a later data round
    assert rows == [1] and all(np.array_equal(a, b) for a, b in zip(feats, more[1:]))


def test_fit_head_end_to_end_with_a_tiny_target(tmp_path, monkeypatch, teacher):
    data = target_answers(teacher.model, random_prompts(20, 48, seed=2), max_new=10)
    _write_shards(tmp_path / "data", data, per_shard=10)
    monkeypatch.setattr(feature_train, "load_model", lambda source, dtype=None: LoadedModel("tiny", teacher.model, 48))
    monkeypatch.setattr(feature_train, "load_tokenizer", lambda source: SimpleNamespace(decode=lambda ids, **kw: ""))
    monkeypatch.setattr(feature_train, "cache_dir", lambda: tmp_path / "cache")
    report = feature_train.fit_head(tmp_path / "data", tmp_path / "head", vocab_size=20, minutes=0.02, batch=4, lr=1e-3,
                                    max_len=64, unroll=2, noise=0.0, seed=0)
    assert report["steps"] >= 1 and len(report["heldout_top1_agreement"]) == 2 and report["train_answers"] == 12
    head, vocab = load_head(tmp_path / "head", teacher.model, torch.float32)
    assert len(vocab) == 20 and vocab == sorted(vocab)
    assert json.loads((tmp_path / "head" / "specviz.json").read_text())["kind"] == "feature-head"
    # training on from that head: with no time to train, the saved head is the one it started from
    again = feature_train.fit_head(tmp_path / "data", tmp_path / "head-2", vocab_size=20, minutes=0, batch=4, lr=1e-3,
                                   max_len=64, unroll=2, noise=0.0, seed=0, init=tmp_path / "head")
    assert again["steps"] == 0 and again["init"] == str(tmp_path / "head")
    continued, _ = load_head(tmp_path / "head-2", teacher.model, torch.float32)
    for (name, a), (_, b) in zip(head.state_dict().items(), continued.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
