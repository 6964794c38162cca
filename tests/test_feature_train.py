"""Training the feature head on tiny random Llamas: training-time test computes exactly what drafting does, the loss
teaches agreement, a warm start drafts as the head it came from, and ``fit_head`` writes a head the engine loads."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specviz.core.drafters import SINGLE_PATH
from specviz.core.sampling import Sampler
from specviz.methods.feature_head import FeatureDrafter, FeatureHead, load_head, save_head
from specviz.models.backends import cached_model
from specviz.models.loaded import LoadedModel
from specviz.training import feature_head as feature_train
from specviz.training.feature_head import collate, sequences, target_states, ttt_losses, ttt_mask, ttt_outputs, warm_start
from tests.conftest import random_prompts, target_answers
from tests.test_feature_head import random_head
from tests.test_train import _write_shards


def _rows(lm):
    return lm.model.model.embed_tokens.weight.detach(), lm.model.lm_head.weight.detach()


def test_ttt_mask_is_the_cache_a_draft_step_sees():
    m = ttt_mask(5, 2, torch.device("cpu")).int()
    # step 2 at position 4 (root 2): target-fed keys 0..2, its step-1 key at 3, its own key at 4
    assert m[4].tolist() == [1, 1, 1, 0, 0] + [0, 0, 0, 1, 0] + [0, 0, 0, 0, 1]
    assert m[1].tolist() == [0] * 5 + [1, 0, 0, 0, 0] + [0, 1, 0, 0, 0]  # no root: only its own chain (never scored)
    assert torch.equal(ttt_mask(4, 0, torch.device("cpu")), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("taps", [(1,), (0, 1)])
def test_training_time_test_computes_what_drafting_computes(tiny_target, taps):
    """Step k of training at position root + k, fed the drafter's own earlier drafts as tokens, picks the drafter's
    (k+1)-th greedy draft: same inputs, same attention pattern, same positions."""
    head, vocab = random_head(tiny_target, seed=4, taps=taps), list(range(0, 96, 2))
    prompt = random_prompts(1, 96, seed=5, lo=12, hi=12)[0]
    target = cached_model(tiny_target, taps=taps)
    drafter = FeatureDrafter(head, target, vocab)
    drafter.read_states(0, target.forward(prompt[:-1]).layers)
    drafts = drafter.draft(prompt, 5, 5, SINGLE_PATH, Sampler()).ids
    x = torch.tensor([prompt + drafts])
    tapped, _ = target_states(tiny_target.model, x, taps)
    embed, rows = _rows(tiny_target)
    with torch.no_grad():
        outs = ttt_outputs(head, embed, x, tapped, 5)
    root = len(prompt) - 2  # the last position the target fed: step k drafts at root + k
    assert [vocab[int((outs[k][0, root + k] @ rows[vocab].T).argmax())] for k in range(5)] == drafts


def test_training_steps_raise_agreement_with_the_target(teacher, teacher_data):
    seqs = sequences(teacher_data, 64)
    x, scored = collate(seqs, list(range(len(seqs))), 0, answers_only=False)
    tapped, normed = target_states(teacher.model, x, (0,))
    embed, rows = _rows(teacher)
    torch.manual_seed(0)
    head = FeatureHead(teacher.model.config)
    _, before = ttt_losses(head, embed, rows, x, tapped, normed, scored, 3)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(60):
        loss, _ = ttt_losses(head, embed, rows, x, tapped, normed, scored, 3)
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, after = ttt_losses(head, embed, rows, x, tapped, normed, scored, 3)
    assert after[0] > before[0] + 0.3 and after[2] > before[2] + 0.2


def test_collate_scores_positions_past_the_shared_prefix_or_predicting_answers():
    seqs = [(np.arange(10), 4), (np.arange(6), 3)]
    _, answers = collate(seqs, [0, 1], skip=3, answers_only=True)
    _, everything = collate(seqs, [0, 1], skip=3, answers_only=False)
    assert answers[0].nonzero().flatten().tolist() == list(range(2, 9)) and answers[1].nonzero().flatten().tolist() == [1, 2, 3, 4]
    assert everything[0].nonzero().flatten().tolist() == list(range(1, 9)) and everything[1].sum() == 4


def test_a_warm_start_drafts_as_the_head_it_came_from(tiny_target, tmp_path):
    old = random_head(tiny_target, seed=2)
    save_head(old, tmp_path / "old", "tiny", {}, {"ids": list(range(96))})
    new = warm_start(FeatureHead(tiny_target.model.config, (0, 1)), tmp_path / "old", tiny_target.model)
    loaded = load_head(tmp_path / "old", tiny_target.model, torch.float32)[0]
    prompt = random_prompts(1, 96, seed=8, lo=10, hi=10)[0]
    drafts = []
    for head, taps in ((loaded, (1,)), (new.eval(), (0, 1))):
        target = cached_model(tiny_target, taps=taps)
        drafter = FeatureDrafter(head, target, None)
        drafter.read_states(0, target.forward(prompt[:-1]).layers)
        drafts.append(drafter.draft(prompt, 4, 4, SINGLE_PATH, Sampler()).ids)
    assert drafts[0] == drafts[1]


def test_fit_head_end_to_end_with_a_tiny_target(tmp_path, monkeypatch, tiny_target):
    data = target_answers(tiny_target.model, random_prompts(20, 96, seed=2), max_new=10)
    _write_shards(tmp_path / "data", data, per_shard=10)
    monkeypatch.setattr(feature_train, "load_model", lambda source, dtype=None: LoadedModel("tiny", tiny_target.model, 96))
    monkeypatch.setattr(feature_train, "load_tokenizer", lambda source: SimpleNamespace(decode=lambda ids, **kw: ""))
    kw = dict(vocab_size=20, batch=4, lr=1e-3, max_len=64, steps_ahead=3, step_weight=0.8, seed=0, eval_every=40,
              target_dtype=torch.float32)
    report = feature_train.fit_head(tmp_path / "data", tmp_path / "head", (0, 1), minutes=0.03, **kw)
    assert report["steps"] >= 1 and len(report["heldout_top1_agreement"]) == 3 and report["train_answers"] == 12
    assert len(report["heldout_top1_agreement_int8"]) == 3
    assert report["curve"][0]["positions"] == 0 and report["curve"][-1]["positions"] == report["positions"] > 0
    head, vocab = load_head(tmp_path / "head", tiny_target.model, torch.float32)
    assert len(vocab) == 20 and vocab == sorted(vocab) and head.taps == (0, 1)
    assert json.loads((tmp_path / "head" / "specviz.json").read_text())["kind"] == "feature-head"
    # training on from that head: with no time to train, the saved head is the one it started from
    again = feature_train.fit_head(tmp_path / "data", tmp_path / "head-2", (0, 1), minutes=0, init=tmp_path / "head", **kw)
    assert again["steps"] == 0 and again["init"] == str(tmp_path / "head")
    continued, _ = load_head(tmp_path / "head-2", tiny_target.model, torch.float32)
    for (name, a), (_, b) in zip(head.state_dict().items(), continued.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
