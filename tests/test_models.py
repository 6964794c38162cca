"""Model resolution, offline failures and vocabulary slicing (the hub presets cannot be loaded here)."""


import pytest

from specviz.cache import CachedModel
from specviz.drafters import ModelDrafter
from specviz.engine import decode
from specviz.models import (
    OFFLINE_PRESET,
    PRESETS,
    ModelLoadError,
    check_shared_vocab,
    load_model,
    resolve_draft,
    resolve_preset,
    shared_vocab_size,
)
from specviz.policies import LengthPolicy
from tests.conftest import tiny_llama


def test_presets_resolve():
    assert resolve_preset(OFFLINE_PRESET).drafts
    qwen = resolve_preset("qwen2.5")
    assert qwen.target == "Qwen/Qwen2.5-7B-Instruct" and resolve_draft(qwen, "0.5b") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_draft(qwen, "someone/else") == "someone/else"
    assert resolve_draft(qwen, "ngram") == "ngram"
    for preset in PRESETS.values():
        assert all("/" in src for src in preset.drafts.values())


@pytest.mark.parametrize("name, fragment", [("nope", "unknown preset")])
def test_unknown_preset(name, fragment):
    with pytest.raises(ModelLoadError, match=fragment):
        resolve_preset(name)


def test_unknown_draft_lists_choices():
    with pytest.raises(ModelLoadError, match="draft-s"):
        resolve_draft(resolve_preset(OFFLINE_PRESET), "what")


def test_hub_id_offline_fails_fast_with_the_offline_preset_named(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load_model("nobody/definitely-not-a-model")
    assert OFFLINE_PRESET in str(err.value) and "\n" not in str(err.value)


def test_not_a_path_nor_id():
    with pytest.raises(ModelLoadError, match="neither a local directory nor a hub id"):
        load_model("./missing/dir")




class Tok:
    def __init__(self, tokens):
        self.tokens = tokens

    def __len__(self):
        return len(self.tokens)

    def convert_ids_to_tokens(self, i):
        return self.tokens[i]


def test_tokenizers_must_share_ids():
    base = [f"t{i}" for i in range(500)]
    check_shared_vocab(Tok(base), Tok(base + ["extra"]), "longer-is-fine")
    with pytest.raises(ModelLoadError, match="does not share token ids"):
        check_shared_vocab(Tok(base), Tok(list(reversed(base))), "shuffled")


def test_vocab_mismatch_is_sliced_like_qwen():
    """Qwen2.5 7B has 152,064 logits and 0.5B 151,936: decode over the shared id range only."""
    target, draft = tiny_llama(vocab=100, hidden=32, layers=1, seed=5, init_std=0.3), tiny_llama(96, 32, 1, seed=6, init_std=0.3)
    vocab = shared_vocab_size(target, draft)
    assert vocab == 96
    events = list(decode(CachedModel(target, vocab), [1, 2, 3], drafters=[ModelDrafter(CachedModel(draft, vocab))],
                         policy=LengthPolicy(3), max_new_tokens=30))
    assert all(t < 96 for e in events for t in e.emitted_ids + e.draft_ids)


def test_target_runs_in_float32_on_cpu_unless_asked(monkeypatch):
    import torch

    from specviz import runner

    monkeypatch.setattr(runner, "pick_device", lambda: torch.device("cpu"))
    assert runner.target_dtype("auto") is torch.float32  # bf16 verify forwards round differently: not token-exact
    assert runner.target_dtype("bfloat16") is torch.bfloat16
    monkeypatch.setattr(runner, "pick_device", lambda: torch.device("cuda"))
    assert runner.target_dtype("auto") is torch.bfloat16


def test_bank_keeps_one_copy_per_dtype(monkeypatch):
    import torch

    from specviz import runner

    loads = []
    monkeypatch.setattr(runner, "load_model", lambda source, name, dtype=None: loads.append(dtype) or object())
    bank = runner.ModelBank()
    a, b = bank.model("x", "x", torch.float32), bank.model("x", "x", torch.float32)
    c = bank.model("x", "x", torch.bfloat16)
    assert a is b and a is not c and loads == [torch.float32, torch.bfloat16]
