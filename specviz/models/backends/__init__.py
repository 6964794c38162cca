"""The backend boundary: what a loaded model runs on.

Two entry points, and nothing else of this package is imported above it:
- :func:`place` moves a freshly loaded model to its device and dtype and gives it that device's kernels
  (on CPU: the fp32/bf16 autotune and the narrow GEMM / prepacked linears of :mod:`.cpu`, and the thread count's
  chooser of :mod:`.threads`);
- :func:`cached_model` wraps a model in the cached-model contract of :mod:`specviz.core.cache`, on the
  preallocated lean storage of :mod:`.lean` where the architecture allows, on transformers' ``DynamicCache``
  otherwise.
"""

from __future__ import annotations

import torch

from specviz.core.cache import CachedModel
from specviz.models.backends.cpu import fastest_cpu_dtype, pack_linears, tuned_plan
from specviz.models.backends.graphs import cuda_capture
from specviz.models.backends.kept import borrowed
from specviz.models.backends.lean import LeanStorage
from specviz.models.backends.threads import observe_forward, thread_chooser
from specviz.models.loaded import LoadedModel


def place(model: torch.nn.Module, path: str, device: torch.device, dtype: torch.dtype | None = None) -> None:
    """Move ``model`` (loaded from ``path``) to ``device`` in ``dtype`` (None: bfloat16 on CUDA, the faster
    measured on CPU) with the device's kernels."""
    if device.type == "cpu":
        thread_chooser()
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else fastest_cpu_dtype(path, model)
    model.to(device=device, dtype=dtype)
    if device.type == "cpu" and dtype == torch.float32:
        pack_linears(model, tuned_plan(model))


def supports_lean(lm: LoadedModel) -> bool:
    """Plain Llama or Qwen3 (Llama with per-head q and k norms): no biases, SiLU MLP, default RoPE, no sliding window, a
    single tensor-parallel slice."""
    c = lm.model.config
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    return (c.model_type in ("llama", "qwen3") and not c.attention_bias and not getattr(c, "use_sliding_window", False)
            and not getattr(c, "mlp_bias", False) and c.hidden_act == "silu"
            and getattr(c, "pretraining_tp", 1) == 1 and rope.get("rope_type", "default") == "default")


def cached_model(lm: LoadedModel, vocab_size: int | None = None, full_vocab: bool = True, int8: bool = False,
                 taps: tuple[int, ...] = (), capacity: int | None = None, graphs: bool = False, keep: bool = False) -> CachedModel:
    """The cached model a target or a draft runs on: on the lean storage where the architecture allows (over the
    model's draft vocabulary unless ``full_vocab``; on int8 weights if ``int8`` and the CPU kernels say they pay,
    which only a draft may ask), on transformers' ``DynamicCache`` otherwise. ``taps`` (decoder layer indices, the last
    for the pre-norm states): what each :class:`~specviz.core.cache.Forward` carries besides the logits. A fixed ``capacity`` (positions)
    gives the lean storage static shapes, and ``graphs`` records CUDA graphs of its forwards (:mod:`.graphs`). On a CPU its
    forwards' times choose torch's thread count (:mod:`.threads`). With ``keep``, graphs recorded by an earlier run of
    this model with these shapes are replayed, and this run's are kept for the next (:mod:`.kept`)."""
    vocab_size = vocab_size or lm.vocab_size
    pace = observe_forward if lm.device.type == "cpu" else None
    if not supports_lean(lm):
        return CachedModel(lm, vocab_size, None, taps, pace)

    def build() -> LeanStorage:
        return LeanStorage(lm, vocab_size, full_vocab, int8, capacity, cuda_capture if graphs else None)

    def user(storage: LeanStorage) -> CachedModel:
        return CachedModel(lm, vocab_size, storage, taps, pace)
    if keep and graphs:
        return borrowed(lm.model, (vocab_size, full_vocab, int8, capacity), build, user)
    return user(build())
