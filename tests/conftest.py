"""Shared fixtures: tiny random Llamas (fast, exact comparisons), a tiny teacher's greedy answers with their top-k
(distillation data), and the real offline target (slow).

``SPECVIZ_TEST_DEVICE=cuda`` makes every tensor and tiny model of the tests default to that device, so the
engine's tests run on a GPU (``scripts/measure_cuda.py`` lists the files that hold with it)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from specviz.models.loaded import LoadedModel  # noqa: E402

if os.environ.get("SPECVIZ_TEST_DEVICE"):
    torch.set_default_device(os.environ["SPECVIZ_TEST_DEVICE"])

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # `make test` runs two workers: they share the cores, at a fixed count
    os.environ["SPECVIZ_TORCH_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    torch.set_num_threads(int(os.environ["SPECVIZ_TORCH_THREADS"]))

SERIAL = {"app": ("tests/ui/test_ui_browser.py", "tests/ui/test_load.py", "tests/ui/test_ui_api.py", "tests/ui/test_zerogpu.py"),
          "repository": ("tests/test_registry.py", "tests/test_docs.py", "tests/test_install.py", "tests/test_notebook.py",
                         "tests/test_architecture.py")}
"""Test files that keep to one worker under pytest-xdist, in order: those that serve the app (a second app, or a
decode beside a load test, would change what they measure), and those that add a file to the package or read every
file of the repository."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        group = next((name for name, files in SERIAL.items() if path in files), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def seeded(seed: int) -> torch.Generator:
    """A seeded generator on the default device (``torch.rand(..., generator=...)`` needs the two to agree)."""
    return torch.Generator(torch.get_default_device()).manual_seed(seed)


def chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of counts against expected counts (rescaled to the same total)."""
    from scipy.stats import chisquare

    observed, expected = observed.double().cpu(), expected.double().cpu()
    return float(chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def tiny_llama(vocab: int, hidden: int, layers: int, seed: int, init_std: float = 0.02, heads: int = 2, kv_heads: int = 2) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         initializer_range=init_std, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    device = torch.get_default_device()
    with torch.device("cpu"):  # the same weights whatever the test device: CUDA's generator draws other numbers
        model = LlamaForCausalLM(config).eval()
    model.to(device)
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
    from specviz.runtime.bank import ModelBank

    return ModelBank()


def target_answers(lm, prompts, max_new, k=4):
    """What ``generate_data`` stores, without a tokenizer: the target's greedy answer and its top-k at every step."""
    from transformers import LogitsProcessorList

    from specviz.training.distill_data import TopKRecorder

    rows = []
    for prompt in prompts:
        rec = TopKRecorder(k)
        with torch.inference_mode():
            out = lm.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
                              max_new_tokens=max_new, logits_processor=LogitsProcessorList([rec]))
        answer = out[0, len(prompt):].tolist()
        rows.append((np.array(prompt, np.int32), np.array(answer, np.int32), torch.cat(rec.ids).numpy(), torch.cat(rec.probs).numpy()))
    return rows


def random_prompts(n, vocab, seed, lo=2, hi=9):
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="session")
def teacher():
    return tiny_llama(vocab=48, hidden=32, layers=1, seed=7, init_std=0.3)


@pytest.fixture(scope="session")
def teacher_data(teacher):
    return target_answers(teacher.model, random_prompts(24, 48, seed=0), max_new=10)


@pytest.fixture
def host_reads(monkeypatch):
    """The number of tensor-to-Python reads (``tolist``, ``item``, ``int()``, ``float()``, ``bool()``) made so far."""
    count, inside = [0], [False]

    def counting(original):
        def counted(self, *args, **kwargs):
            if inside[0]:  # the default-device mode (SPECVIZ_TEST_DEVICE) dispatches the patched method again: one read
                return original(self, *args, **kwargs)
            count[0] += 1
            inside[0] = True
            try:
                return original(self, *args, **kwargs)
            finally:
                inside[0] = False
        return counted

    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    return count
