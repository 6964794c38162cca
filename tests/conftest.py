"""Shared fixtures: tiny random Llamas (fast, exact comparisons) and the real offline target (slow)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402
import torch  # noqa: E402

from specviz.models import LoadedModel  # noqa: E402


def tiny_llama(vocab: int, hidden: int, layers: int, seed: int, init_std: float = 0.02, heads: int = 2, kv_heads: int = 2) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         initializer_range=init_std, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return LoadedModel(f"tiny-{hidden}x{layers}-{seed}", model, vocab)


@pytest.fixture(scope="session")
def tiny_target() -> LoadedModel:
    return tiny_llama(vocab=96, hidden=64, layers=2, seed=0, init_std=0.2)


@pytest.fixture(scope="session")
def tiny_draft() -> LoadedModel:
    return tiny_llama(vocab=96, hidden=32, layers=1, seed=1, init_std=0.2)


@pytest.fixture(scope="session")
def small_vocab_pair() -> tuple[LoadedModel, LoadedModel]:
    """A 10-token target and draft: small enough to compute the target's joint over two tokens exactly."""
    return tiny_llama(vocab=10, hidden=32, layers=1, seed=3, init_std=0.3), tiny_llama(vocab=10, hidden=16, layers=1, seed=4, init_std=0.3)


@pytest.fixture(scope="session")
def bank():
    from specviz.runner import ModelBank

    return ModelBank()
