"""The lean draft forward: same logits as transformers' forward, through prefill, multi-token feeds and rollback."""

import pytest
import torch

from specviz.cache import CachedModel
from specviz.drafters import ModelDrafter
from specviz.engine import decode
from specviz.lean import LeanCachedModel, draft_cache, supports_lean
from specviz.sampling import Sampler
from tests.conftest import tiny_llama


def _feeds(seed: int) -> list[tuple[list[int], int]]:
    """A prompt, single-token steps, a 4-token verify-like feed and rollbacks of 1 and 5 tokens."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 96, (30,), generator=g).tolist()
    feeds = [(seq[:20], 1)]
    for n in range(21, 26):
        feeds.append((seq[:n], 1))
    feeds += [(seq[:30], 5), (seq[:29] + [7], 2), (seq[:24] + [3, 4], 1), (seq[:27], 3)]
    return feeds


@pytest.mark.parametrize("dtype, kv_heads", [(torch.float32, 4), (torch.float32, 2), (torch.bfloat16, 4)])
def test_lean_forward_matches_transformers(dtype, kv_heads):
    lm = tiny_llama(vocab=96, hidden=64, layers=2, seed=5, init_std=0.2, heads=4, kv_heads=kv_heads)  # kv_heads 2: grouped queries
    lm.model.to(dtype)
    hf, lean = CachedModel(lm), LeanCachedModel(lm)
    for tokens, keep in _feeds(0):
        a, b = hf.forward(tokens, keep), lean.forward(tokens, keep)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(b.float(), a.float(), atol=tol, rtol=0)
        assert lean.ids == hf.ids == tokens
    assert lean.forwards == hf.forwards and lean.forward_s > 0


def test_the_cache_grows_past_its_first_reservation(tiny_draft):
    hf, lean = CachedModel(tiny_draft), LeanCachedModel(tiny_draft)
    tokens = torch.randint(0, 96, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    torch.testing.assert_close(lean.forward(tokens[:250], 2), hf.forward(tokens[:250], 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(lean.forward(tokens, 1), hf.forward(tokens, 1), atol=1e-5, rtol=0)
    assert lean.k.shape[3] >= 300


def test_lean_drafts_equal_transformers_drafts_and_stay_lossless(tiny_target, tiny_draft):
    prompt = [5, 17, 33, 2, 60, 41]
    runs = [list(decode(CachedModel(tiny_target), prompt, drafters=[ModelDrafter(make(tiny_draft))], max_new_tokens=24))
            for make in (CachedModel, LeanCachedModel)]
    assert [(e.draft_ids, e.emitted_ids) for e in runs[0]] == [(e.draft_ids, e.emitted_ids) for e in runs[1]]
    sampled = [list(decode(CachedModel(tiny_target), prompt, drafters=[ModelDrafter(make(tiny_draft))],
                           sampler=Sampler(1.0, 1.0, seed=3), max_new_tokens=24)) for make in (CachedModel, LeanCachedModel)]
    assert [e.emitted_ids for e in sampled[0]] == [e.emitted_ids for e in sampled[1]]


def test_unsupported_architectures_keep_the_transformers_forward(tiny_draft):
    assert supports_lean(tiny_draft) and isinstance(draft_cache(tiny_draft), LeanCachedModel)
    tiny_draft.model.config.attention_bias = True
    try:
        assert not supports_lean(tiny_draft) and type(draft_cache(tiny_draft)) is CachedModel
    finally:
        tiny_draft.model.config.attention_bias = False
    with pytest.raises(ValueError, match="pre-norm"):
        LeanCachedModel(tiny_draft).forward([1, 2, 3], capture=True)
