"""The feature-level draft head: its drafting path equals its training forward, decoding with it stays
lossless, and its files load or fail with one clear line."""

import pytest
import torch
import torch.nn.functional as F

from specviz.core.cache import CachedModel
from specviz.core.drafters import SINGLE_PATH
from specviz.core.engine import decode
from specviz.core.errors import ModelLoadError
from specviz.core.hidden import layer_outputs
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler
from specviz.methods.feature_head import FeatureDrafter, FeatureHead, head_dtype, is_feature_head, load_head, save_head, tap_states
from specviz.models.backends import cached_model
from specviz.models.backends.graphs import eager_capture
from specviz.models.backends.lean import LeanStorage

from .conftest import tiny_llama
from .test_engine import PROMPTS, reference

TAPS = [(1,), (0, 1)]  # the tiny target's last layer (as the first head); an early and the last (as EAGLE-3)


def random_head(lm, seed: int = 0, taps: tuple[int, ...] = (1,)) -> FeatureHead:
    torch.manual_seed(seed)
    head = FeatureHead(lm.model.config, taps)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return head.eval()


def expected_drafts(lm, head: FeatureHead, tokens: list[int], gamma: int, vocab: list[int]) -> list[int]:
    """Greedy drafts computed with the head's training forward over whole sequences: the target's states for
    the committed tokens, then the head's own estimates, one more position per draft."""
    with torch.inference_mode():
        _, outputs = layer_outputs(lm.model, head.taps, input_ids=torch.tensor([tokens]))
        states = head.state(tap_states(outputs, head.taps, lm.model))[0, : len(tokens) - 1]
        embed, rows, nexts = lm.model.model.embed_tokens.weight, lm.model.lm_head.weight[vocab], tokens[1:]
        drafts = []
        for _ in range(gamma):
            out = head(states[None], F.embedding(torch.tensor([nexts]), embed))[0, -1]
            drafts.append(vocab[int((rows @ out).argmax())])
            states, nexts = torch.cat([states, out[None]]), nexts + drafts[-1:]
    return drafts


@pytest.mark.parametrize("taps", TAPS)
@pytest.mark.parametrize("cached", [CachedModel, cached_model])
def test_drafts_equal_the_training_forward_also_after_rejections(tiny_target, cached, taps):
    head, vocab = random_head(tiny_target, taps=taps), list(range(0, 96, 3))
    target = cached(tiny_target, taps=taps)
    drafter = FeatureDrafter(head, target, vocab)
    events = list(decode(target, PROMPTS[3], drafters=[drafter], policy=FixedPolicy(4), max_new_tokens=30))
    assert any(e.accepted < e.drafted for e in events)  # some drafts were rejected and rolled back
    tokens = PROMPTS[3] + [t for e in events for t in e.emitted_ids]
    for e, before in zip(events, [PROMPTS[3] + [t for x in events[:i] for t in x.emitted_ids] for i in range(len(events))]):
        assert e.draft_ids == expected_drafts(tiny_target, head, before, e.drafted, vocab)
    assert drafter.draft(tokens, 3, 3, SINGLE_PATH, Sampler()).ids == expected_drafts(tiny_target, head, tokens, 3, vocab)


@pytest.mark.parametrize("taps", TAPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_decoding_with_a_feature_head_matches_generate(tiny_target, gamma, prompt, dtype, taps):
    target = cached_model(tiny_target, taps=taps)
    drafter = FeatureDrafter(random_head(tiny_target, gamma, taps).to(dtype), target, None)
    events = list(decode(target, prompt, drafters=[drafter], policy=FixedPolicy(gamma), max_new_tokens=40))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, 40)
    assert sum(len(e.draft_ids) for e in events) >= 10 * min(gamma, 3) or len(prompt) == 1


@pytest.mark.parametrize("taps", TAPS)
def test_with_static_shapes_and_graphs_the_head_still_matches_generate(tiny_target, taps):
    """A GPU run's head: a fixed-capacity cache, its one-layer forwards recorded (eagerly here, as CUDA graphs there)."""
    prompt, n = PROMPTS[1], 40
    target = CachedModel(tiny_target, storage=LeanStorage(tiny_target, tiny_target.vocab_size, capacity=len(prompt) + n + 1,
                                                          capture=eager_capture), taps=taps)
    drafter = FeatureDrafter(random_head(tiny_target, 3, taps), target, None, capacity=len(prompt) + n + 1, capture=eager_capture)
    events = list(decode(target, prompt, drafters=[drafter], policy=FixedPolicy(3), max_new_tokens=n))
    assert [t for e in events for t in e.emitted_ids] == reference(tiny_target, prompt, n)
    assert drafter.stack.graphs.recorded and target.storage.stack.graphs.recorded


def test_a_one_token_prompt_starts_drafting_after_the_first_step(tiny_target):
    target = cached_model(tiny_target, taps=(1,))
    drafter = FeatureDrafter(random_head(tiny_target), target, None)
    events = list(decode(target, [42], drafters=[drafter], policy=FixedPolicy(3), max_new_tokens=10))
    assert events[0].draft_ids == [] and all(len(e.draft_ids) > 0 for e in events[1:-1])


def test_sampled_drafts_come_from_their_q_on_the_draft_vocabulary(tiny_target):
    vocab = list(range(0, 96, 2))
    target = cached_model(tiny_target, taps=(1,))
    drafter = FeatureDrafter(random_head(tiny_target), target, vocab)
    drafter.read_states(0, target.forward(PROMPTS[0][:-1]).layers)
    draft = drafter.draft(PROMPTS[0], 5, 5, SINGLE_PATH, Sampler(1.0, 1.0, seed=3))
    torch.testing.assert_close(draft.q[:, vocab].sum(-1), torch.ones(5))
    assert all(t in vocab and q > 0 for t, q in zip(draft.ids, draft.q_of_ids()))


def test_the_drafter_reads_the_states_handed_to_it(tiny_target):
    with pytest.raises(ValueError, match=r"build the target with taps=\(1,\)"):
        FeatureDrafter(random_head(tiny_target), cached_model(tiny_target), None)
    with pytest.raises(ValueError, match=r"build the target with taps=\(0, 1\)"):
        FeatureDrafter(random_head(tiny_target, taps=(0, 1)), cached_model(tiny_target, taps=(1,)), None)
    head, tokens = random_head(tiny_target), PROMPTS[0]
    target = cached_model(tiny_target, taps=(1,))
    prefilled = target.prefill(tokens)
    handed, unhanded = FeatureDrafter(head, target, None), FeatureDrafter(head, target, None)
    handed.read_states(prefilled.start, prefilled.layers)
    assert handed.draft(tokens, 4, 4, SINGLE_PATH, Sampler()).ids == expected_drafts(tiny_target, head, tokens, 4, list(range(96)))
    with pytest.raises(AssertionError, match="handed over"):  # the target keeps no states for it to fish out
        unhanded.draft(tokens, 4, 4, SINGLE_PATH, Sampler())


@pytest.mark.parametrize("taps", TAPS)
def test_save_and_load_round_trip_and_bad_files(tiny_target, tiny_draft, tmp_path, taps):
    head = random_head(tiny_target, taps=taps)
    save_head(head, tmp_path / "h", "tiny", {"steps": 0}, {"ids": [1, 2, 3]})
    assert is_feature_head(tmp_path / "h") and not is_feature_head(tmp_path)
    loaded, vocab = load_head(tmp_path / "h", tiny_target.model, torch.float32)
    assert vocab == [1, 2, 3] and loaded.taps == taps and FeatureDrafter.reads_layers(tmp_path / "h", 2) == taps
    assert load_head(tmp_path / "h", tiny_target.model)[0].fc.weight.dtype == head_dtype(tiny_target.model)
    for (name, a), b in zip(head.named_parameters(), loaded.parameters()):  # int8 rows: within half a step of 1/127 of the row max
        bound = a.abs().amax(-1, keepdim=True) / 254 + 1e-7 if a.dim() == 2 else 0
        assert ((a - b).abs() <= bound).all(), name
    with pytest.raises(ModelLoadError, match="does not fit this target|cannot load"):
        load_head(tmp_path / "h", tiny_draft.model)  # another width
    if len(taps) > 1:
        with pytest.raises(ModelLoadError, match="does not fit this target: taps must be"):
            load_head(tmp_path / "h", tiny_llama(vocab=96, hidden=64, layers=1, seed=0).model)  # a layer it taps is missing
    (tmp_path / "h" / "head.safetensors").write_bytes(b"not weights")
    with pytest.raises(ModelLoadError, match="cannot load feature head"):
        load_head(tmp_path / "h", tiny_target.model)
