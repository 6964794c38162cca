"""The lean forward: transformers' logits (bitwise on a packed fp32 model), through prefill, multi-token feeds and rollback."""

import pytest
import torch

from specviz.core.cache import CachedModel
from specviz.core.drafters import SINGLE_PATH, ModelDrafter
from specviz.core.engine import decode
from specviz.core.errors import ConfigError
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler
from specviz.models.backends import cached_model, supports_lean
from specviz.models.backends.cpu import int8_kernels, int8_linear, pack_linears, quantize_rows
from specviz.models.backends.graphs import MAX_GRAPHED_LENGTH, eager_capture
from specviz.models.backends.lean import LeanStorage
from specviz.models.loaded import LoadedModel
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import static_shapes
from tests.conftest import seeded, tiny_llama
from tests.test_engine import reference


def _feeds(seed: int) -> list[tuple[list[int], int]]:
    """A prompt, single-token steps, a 4-token verify-like feed and rollbacks of 1 and 5 tokens."""
    seq = torch.randint(0, 96, (30,), generator=seeded(seed)).tolist()
    feeds = [(seq[:20], 1)]
    for n in range(21, 26):
        feeds.append((seq[:n], 1))
    feeds += [(seq[:30], 5), (seq[:29] + [7], 2), (seq[:24] + [3, 4], 1), (seq[:27], 3)]
    return feeds


@pytest.mark.parametrize("dtype, kv_heads", [(torch.float32, 4), (torch.float32, 2), (torch.bfloat16, 4)])
def test_lean_forward_matches_transformers(dtype, kv_heads):
    lm = tiny_llama(vocab=96, hidden=64, layers=2, seed=5, init_std=0.2, heads=4, kv_heads=kv_heads)  # kv_heads 2: grouped queries
    lm.model.to(dtype)
    hf, lean = CachedModel(lm), cached_model(lm)
    for tokens, keep in _feeds(0):
        a, b = hf.forward(tokens, keep).logits, lean.forward(tokens, keep).logits
        tol = 1e-5 if dtype == torch.float32 else 3e-2 if lm.device.type == "cpu" else 6e-2  # CUDA's fused norm rounds otherwise
        torch.testing.assert_close(b.float(), a.float(), atol=tol, rtol=0)
        assert lean.ids == hf.ids == tokens
    assert lean.forwards == hf.forwards and lean.forward_s > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_of_a_qwen3_matches_transformers(dtype):
    """Qwen3 is Llama with an RMS norm over each head's queries and keys before RoPE."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(9)
    config = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, max_position_embeddings=512, initializer_range=0.2)
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(config).eval()
    for layer in model.model.layers:  # random norms, so a missing or misplaced q/k norm shows
        torch.nn.init.normal_(layer.self_attn.q_norm.weight, 1.0, 0.5)
        torch.nn.init.normal_(layer.self_attn.k_norm.weight, 1.0, 0.5)
    lm = LoadedModel("tiny-qwen3", model.to(torch.get_default_device(), dtype), 96)
    hf, lean = CachedModel(lm), cached_model(lm)
    assert supports_lean(lm) and isinstance(lean.storage, LeanStorage)
    for tokens, keep in _feeds(1):
        # CUDA's fused norm rounds once where transformers' rounds twice, over random q and k norms
        tol = 1e-5 if dtype == torch.float32 else 3e-2 if lm.device.type == "cpu" else 0.15
        torch.testing.assert_close(lean.forward(tokens, keep).logits.float(), hf.forward(tokens, keep).logits.float(), atol=tol, rtol=0)


@pytest.mark.skipif(torch.get_default_device().type != "cpu", reason="oneDNN packing is for CPUs")
def test_on_a_packed_fp32_model_logits_and_pre_norm_states_are_bitwise_transformers():
    """What keeps the target exact: the engine's greedy tokens match ``generate`` only if its logits do."""
    lm = tiny_llama(vocab=96, hidden=64, layers=2, seed=6, init_std=0.2, heads=4, kv_heads=2)
    pack_linears(lm.model)
    hf, lean = CachedModel(lm, taps=(1,)), cached_model(lm, taps=(1,))  # the last layer's tap: the pre-norm states
    for tokens, keep in _feeds(3):
        a, b = hf.forward(tokens, keep), lean.forward(tokens, keep)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.prenorm, b.prenorm)
    assert cached_model(lm).forward(list(range(12)), 2).prenorm is None


@pytest.mark.parametrize("cached", [CachedModel, cached_model])
def test_tapped_layer_outputs_are_the_layers_and_leave_the_logits_alone(cached):
    lm = tiny_llama(vocab=96, hidden=64, layers=3, seed=6, init_std=0.2, heads=4, kv_heads=2)
    plain, tapped = cached(lm), cached(lm, taps=(0, 2))
    tokens = list(range(5, 30))
    with torch.inference_mode():
        hidden = lm.model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
    for n in (12, 20, 18, 25):  # a prefill, a step forward, a rollback and another step
        a, b = plain.forward(tokens[:n], 3), tapped.forward(tokens[:n], 3)
        assert torch.equal(a.logits, b.logits) and a.layers is None and set(b.layers) == {0, 2} and tapped.prenorm
        # a GPU's fp32 attention kernels round a little differently from transformers' path
        torch.testing.assert_close(b.layers[0], hidden[1][0, b.start:n], atol=1e-5 if b.layers[0].device.type == "cpu" else 5e-5, rtol=0)
        torch.testing.assert_close(b.prenorm, b.layers[2][-3:], atol=0, rtol=0)


def test_runs_on_one_model_share_its_prepared_layers(tiny_draft):
    a, b = cached_model(tiny_draft), cached_model(tiny_draft)
    assert a.storage.stack.layers is b.storage.stack.layers  # fused weights are concatenated once per model, not once per request
    a.forward(list(range(8)))
    assert b.ids == [] and b.storage.stack.k is None  # caches stay per run
    lm = tiny_llama(vocab=96, hidden=32, layers=1, seed=8, init_std=0.2)
    before = cached_model(lm).storage.stack.layers
    lm.model.to(torch.bfloat16)
    moved = cached_model(lm)
    assert moved.storage.stack.layers is not before and moved.forward(list(range(8))).logits.dtype == torch.bfloat16


@pytest.mark.parametrize("packed", [False, True])
def test_the_joined_layers_hold_their_weights_once(packed):
    lm = tiny_llama(vocab=96, hidden=64, layers=2, seed=3, init_std=0.2, heads=4, kv_heads=2)
    if packed:
        pack_linears(lm.model)
    hf = CachedModel(lm).forward(list(range(12)), 4).logits
    lean = cached_model(lm)
    for layer in lm.model.model.layers:  # q|k|v, and gate|up, are rows of one tensor each, which the layers view
        for group in ([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], [layer.mlp.gate_proj, layer.mlp.up_proj]):
            storage = {m.weight.untyped_storage().data_ptr() for m in group}
            assert len(storage) == 1
    assert torch.equal(lean.forward(list(range(12)), 4).logits, hf)  # the same weights, and transformers' forward on them
    assert torch.equal(CachedModel(lm).forward(list(range(12)), 4).logits, hf)


def test_the_cache_grows_past_its_first_reservation(tiny_draft):
    hf, lean = CachedModel(tiny_draft), cached_model(tiny_draft)
    tokens = torch.randint(0, 96, (300,), generator=seeded(1)).tolist()
    torch.testing.assert_close(lean.forward(tokens[:250], 2).logits, hf.forward(tokens[:250], 2).logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(lean.forward(tokens, 1).logits, hf.forward(tokens, 1).logits, atol=1e-5, rtol=0)
    assert lean.storage.stack.k.shape[3] >= 300


def test_lean_drafts_equal_transformers_drafts_and_stay_lossless(tiny_target, tiny_draft):
    prompt = [5, 17, 33, 2, 60, 41]
    runs = [list(decode(CachedModel(tiny_target), prompt, drafters=[ModelDrafter(make(tiny_draft))], policy=FixedPolicy(4),
                        max_new_tokens=24))
            for make in (CachedModel, cached_model)]
    assert [(e.draft_ids, e.emitted_ids) for e in runs[0]] == [(e.draft_ids, e.emitted_ids) for e in runs[1]]
    assert sum(len(e.draft_ids) for e in runs[0]) >= 20
    sampled = [list(decode(CachedModel(tiny_target), prompt, drafters=[ModelDrafter(make(tiny_draft))], policy=FixedPolicy(4),
                           sampler=Sampler(1.0, 1.0, seed=3), max_new_tokens=24)) for make in (CachedModel, cached_model)]
    assert [e.emitted_ids for e in sampled[0]] == [e.emitted_ids for e in sampled[1]]


def with_draft_vocab(lm, ids):
    return LoadedModel(lm.name, lm.model, lm.vocab_size, ids)


def test_a_draft_vocabulary_scores_only_its_tokens(tiny_draft):
    ids = list(range(0, 96, 3))
    restricted = with_draft_vocab(tiny_draft, ids + [500])  # ids past the vocab are dropped
    hf, lean = CachedModel(tiny_draft), cached_model(restricted, full_vocab=False)
    for tokens, keep in _feeds(2):
        a, b = hf.forward(tokens, keep).logits, lean.forward(tokens, keep).logits
        assert b.shape == a.shape
        torch.testing.assert_close(b[:, ids], a[:, ids], atol=1e-5, rtol=0)
        outside = torch.ones(96, dtype=torch.bool)
        outside[ids] = False
        assert torch.isneginf(b[:, outside]).all()
    full = cached_model(with_draft_vocab(tiny_draft, ids), full_vocab=True)
    torch.testing.assert_close(full.forward(list(range(10)), 2).logits, CachedModel(tiny_draft).forward(list(range(10)), 2).logits,
                               atol=1e-5, rtol=0)
    assert cached_model(with_draft_vocab(tiny_draft, ids)).storage.head_ids is None  # a target never restricts its vocabulary
    assert torch.equal(cached_model(with_draft_vocab(tiny_draft, ids), full_vocab=False).storage.head_ids, torch.tensor(ids))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_with_a_small_vocabulary_never_proposes_outside_it_and_stays_lossless(tiny_target, temperature):
    """The target drafting for itself over half its vocabulary: it proposes only those tokens, and the emitted
    text is still the target's own."""
    ids = list(range(0, 96, 2))
    prompt = [5, 17, 33, 2, 60, 41]
    drafter = ModelDrafter(cached_model(with_draft_vocab(tiny_target, ids), full_vocab=False))
    events = list(decode(CachedModel(tiny_target), prompt, drafters=[drafter], policy=FixedPolicy(4),
                       sampler=Sampler(temperature, 1.0, seed=4), max_new_tokens=40))
    assert all(t in ids for e in events for t in e.draft_ids) and sum(e.accepted for e in events) >= 10
    emitted = [t for e in events for t in e.emitted_ids]
    assert any(t not in ids for t in emitted)  # the target still emits tokens the draft cannot propose
    drafter = ModelDrafter(cached_model(with_draft_vocab(tiny_target, ids), full_vocab=False))
    q = drafter.draft(prompt, 4, 4, SINGLE_PATH, Sampler(temperature, 1.0, seed=1)).q
    torch.testing.assert_close(q[:, ids].sum(-1), torch.ones(4))  # q lives on the draft vocabulary: what it samples from
    if temperature == 0:
        plain = list(decode(CachedModel(tiny_target), prompt, max_new_tokens=40))
        assert emitted == [t for e in plain for t in e.emitted_ids]


def test_unsupported_architectures_keep_the_transformers_forward(tiny_draft):
    assert supports_lean(tiny_draft) and isinstance(cached_model(tiny_draft).storage, LeanStorage)
    tiny_draft.model.config.attention_bias = True
    try:
        assert not supports_lean(tiny_draft) and type(cached_model(tiny_draft)) is CachedModel
    finally:
        tiny_draft.model.config.attention_bias = False


def test_int8_kernels_multiply_by_weights_quantized_per_row():
    weight = torch.randn(40, 64, generator=seeded(2))
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and ((q.float() * scale[:, None] - weight).abs() <= weight.abs().amax(1, keepdim=True) / 254 + 1e-6).all()
    x = torch.randn(3, 5, 64, generator=seeded(3)).bfloat16()
    expected = x.float() @ (q.float() * scale[:, None]).t()
    torch.testing.assert_close(int8_linear(weight.bfloat16())(x).float(), expected, atol=0.15, rtol=0.02)
    assert not int8_kernels(torch.float32, torch.device("cpu")) and not int8_kernels(torch.bfloat16, torch.device("cuda"))


@pytest.mark.skipif(torch.get_default_device().type != "cpu" or not int8_kernels(torch.bfloat16, torch.device("cpu")),
                    reason="int8 drafts are a CPU kernel, and this torch has none")
def test_an_int8_bf16_draft_stays_close_to_its_weights_and_lossless(tiny_target):
    lm = tiny_llama(vocab=96, hidden=32, layers=1, seed=8, init_std=0.2)
    lm.model.to(torch.bfloat16)
    dense, quantized = cached_model(lm), cached_model(lm, int8=True)
    layers = quantized.storage.stack.layers
    assert layers is not dense.storage.stack.layers and cached_model(lm).storage.stack.layers is dense.storage.stack.layers
    tokens = list(range(3, 40))
    torch.testing.assert_close(quantized.forward(tokens, 4).logits.float(), dense.forward(tokens, 4).logits.float(), atol=0.1, rtol=0.05)
    prompt = [5, 17, 33, 2, 60, 41]
    events = list(decode(CachedModel(tiny_target), prompt, drafters=[ModelDrafter(cached_model(lm, int8=True))],
                         policy=FixedPolicy(4), max_new_tokens=24))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, 24)


def static_storage(lm, capacity: int, graphs: bool = False, taps: tuple[int, ...] = ()) -> CachedModel:
    """The lean storage with the static shapes a GPU run gets; ``graphs`` records them with the eager stand-in for CUDA
    graphs (same buffers, same replay contract)."""
    storage = LeanStorage(lm, lm.vocab_size, capacity=capacity, capture=eager_capture if graphs else None)
    return CachedModel(lm, storage=storage, taps=taps)


@pytest.mark.parametrize("graphs", [False, True])
def test_a_fixed_capacity_cache_gives_the_growing_caches_logits(graphs):
    lm = tiny_llama(vocab=96, hidden=64, layers=2, seed=5, init_std=0.2, heads=4, kv_heads=2)
    grown, static = cached_model(lm, taps=(0,)), static_storage(lm, 32, graphs, taps=(0,))
    for tokens, keep in _feeds(1) + _feeds(1):  # the second pass replays the graphs recorded in the first
        a, b = grown.forward(tokens, keep), static.forward(tokens, keep)
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)  # other attention kernels: fp32 rounding
        torch.testing.assert_close(b.layers[0], a.layers[0], atol=1e-5, rtol=1e-5)
    stack = static.storage.stack
    assert stack.k.shape[3] == 32 and (stack.graphs is None) != graphs
    if graphs:  # one recording per (fed positions, taps); replays hand out copies, never the graph's own buffers
        assert set(stack.graphs.recorded) == {(t, (0,)) for t in (1, 5, 2, 3)}  # not the 20-token prefill
        out = static.forward(list(range(10)), 1).logits
        again = static.forward(list(range(10)) + [4], 1).logits
        assert not torch.equal(out, again) and out.data_ptr() != again.data_ptr()


def test_a_long_feed_and_a_prefill_run_without_a_recording(tiny_draft):
    static = static_storage(tiny_draft, 2 * MAX_GRAPHED_LENGTH + 8, graphs=True)
    static.forward([3] * 4, 1)  # a short prefill: from the first slot, once per run
    static.forward([3] * 4 + [5] * (MAX_GRAPHED_LENGTH + 1), 1)
    assert not static.storage.stack.graphs.recorded
    static.forward([3] * 4 + [5] * (MAX_GRAPHED_LENGTH + 2), 1)
    assert list(static.storage.stack.graphs.recorded) == [(1, ())]


def refused_capture(fn):
    raise RuntimeError("operation not permitted when stream is capturing\nsecond line")


def test_a_refused_recording_falls_back_to_eager_forwards_with_the_same_tokens(tiny_target, tiny_draft):
    prompt = [5, 17, 2, 9, 33]
    capacity = len(prompt) + 24 + 1
    target = CachedModel(tiny_target, storage=LeanStorage(tiny_target, tiny_target.vocab_size, capacity=capacity, capture=refused_capture))
    draft = ModelDrafter(static_storage(tiny_draft, capacity, graphs=True))
    events = list(decode(target, prompt, drafters=[draft], policy=FixedPolicy(4), max_new_tokens=24))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, 24)
    graphs = target.storage.stack.graphs
    assert graphs.failure == "RuntimeError: operation not permitted when stream is capturing" and not graphs.recorded
    assert draft.model.storage.stack.graphs.recorded and draft.model.storage.stack.graphs.failure is None


def test_static_decoding_equals_generate(tiny_target, tiny_draft):
    prompt = [5, 17, 2, 9, 33]
    target = static_storage(tiny_target, len(prompt) + 24 + 1, graphs=True)
    draft = ModelDrafter(static_storage(tiny_draft, len(prompt) + 24 + 1, graphs=True))
    events = list(decode(target, prompt, drafters=[draft], policy=FixedPolicy(4), max_new_tokens=24))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, 24)


def test_the_fixed_capacity_is_a_limit_and_graphs_need_it(tiny_draft):
    with pytest.raises(ValueError, match="past the KV cache's fixed capacity of 8"):
        static_storage(tiny_draft, 8).forward(list(range(9)), 1)
    with pytest.raises(ValueError, match="graphs need static shapes"):
        LeanStorage(tiny_draft, tiny_draft.vocab_size, capture=eager_capture)


def test_static_shapes_and_graphs_follow_the_device_the_option_and_zerogpu(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert static_shapes(DecodeConfig(), cpu, 10) == (None, False)
    assert static_shapes(DecodeConfig(cuda_graphs="off"), cpu, 10) == (None, False)
    with pytest.raises(ConfigError, match="--cuda-graphs on needs a CUDA device"):
        static_shapes(DecodeConfig(cuda_graphs="on"), cpu, 10)
    config = DecodeConfig(max_new_tokens=20)
    assert static_shapes(config, cuda, 10) == (256, True)  # room for 31 positions, rounded up: short runs share shapes
    assert static_shapes(DecodeConfig(max_new_tokens=20, cuda_graphs="off"), cuda, 10) == (256, False)
    assert static_shapes(config, cuda, 236) == (512, True) and static_shapes(config, cuda, 235) == (256, True)
    assert static_shapes(DecodeConfig(max_new_tokens=20, tree_nodes=8), cuda, 200) == (512, True)  # the tree's slots count
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # measured: graphs recorded inside each call beat eager forwards there too
    assert static_shapes(config, cuda, 10) == (256, True)
    assert static_shapes(DecodeConfig(max_new_tokens=20, cuda_graphs="off"), cuda, 10) == (256, False)


def test_a_run_replays_the_graphs_an_earlier_run_recorded_and_runs_at_once_never_share_a_cache(tiny_target, monkeypatch):
    """As a reused ZeroGPU worker's calls: a storage comes back when its run's cached model is collected, and the next run
    of that model and shapes takes it, its graphs recorded already; a run while another holds it builds its own."""
    import gc

    from specviz.models import backends
    from specviz.models.backends import kept

    monkeypatch.setattr(backends, "cuda_capture", eager_capture)
    long, short = list(range(3, 40)), [5, 17, 2, 9, 33]

    def run(prompt: list[int]) -> tuple[CachedModel, list[int]]:
        target = cached_model(tiny_target, capacity=64, graphs=True, keep=True)
        return target, [t for e in decode(target, prompt, drafters=[ModelDrafter(cached_model(tiny_target))], policy=FixedPolicy(3),
                                          max_new_tokens=16) for t in e.emitted_ids]

    first, tokens = run(long)
    assert tokens == reference(tiny_target, long, 16)
    storage, recorded = first.storage, dict(first.storage.stack.graphs.recorded)
    held = cached_model(tiny_target, capacity=64, graphs=True, keep=True)
    assert held.storage is not storage and not held.storage.stack.graphs.recorded
    del first
    gc.collect()
    assert kept.waiting(tiny_target.model, (96, True, False, 64)) == 1
    second, tokens = run(short)  # a shorter prompt over the longer run's cache: nothing of it is read
    assert second.storage is storage and tokens == reference(tiny_target, short, 16)
    assert all(storage.stack.graphs.recorded[key] is value for key, value in recorded.items())  # replayed, not recorded again
    other = cached_model(tiny_target, capacity=128, graphs=True, keep=True)  # other shapes: another storage
    assert other.storage is not storage and kept.waiting(tiny_target.model, (96, True, False, 64)) == 0
    unkept = cached_model(tiny_target, capacity=64, graphs=True)
    del unkept
    gc.collect()
    assert kept.waiting(tiny_target.model, (96, True, False, 64)) == 0  # a storage built without keep is never kept
    del second, held
    gc.collect()
    assert kept.waiting(tiny_target.model, (96, True, False, 64)) == 2
