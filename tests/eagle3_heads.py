"""Synthetic published-format EAGLE-3 heads and tiny targets to pair them with: tiny dimensions, but the key names and
config fields of the published checkpoints (the EAGLE layout of yuhuili / AngelSlim, the speculators layout of
RedHatAI), and an independent reference forward written from the raw tensors. Used by tests/test_eagle3.py and by
scripts/gpu_check.py (which scales the same builder to an 8B shape)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def tiny_target_dir(path: Path, family: str = "llama", vocab: int = 96, hidden: int = 64, layers: int = 6, heads: int = 4,
                    kv_heads: int = 2, seed: int = 0, std: float = 0.2) -> Path:
    """A random-weight Llama or Qwen3 causal LM saved with a word-level tokenizer (``t0`` … ``t{vocab-1}``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen3Config

    kind = {"llama": LlamaConfig, "qwen3": Qwen3Config}[family]
    config = kind(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=hidden // heads, max_position_embeddings=512, initializer_range=std,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0").save_pretrained(path)
    return Path(path)


def write_head(path: Path, target_config, *, layout: str = "eagle", draft_ids: list[int] | None = None, own_embed: bool = False,
               norm_before_residual: bool = False, aux_ids: list[int] | None = None, seed: int = 1, std: float = 0.2,
               weights_file: str = "model.safetensors", drop: tuple[str, ...] = (), dtype: torch.dtype = torch.float32,
               device: str = "cpu") -> Path:
    """A random head for ``target_config`` in the published layout ``layout`` (``eagle`` or ``speculators``); the draft
    vocabulary is ``draft_ids`` (target ids, mapped by d2t) or the whole vocabulary; ``drop`` leaves tensors out."""
    tc = target_config
    hidden, heads, kv_heads = tc.hidden_size, tc.num_attention_heads, tc.num_key_value_heads
    head_dim = getattr(tc, "head_dim", None) or hidden // heads
    inter = tc.intermediate_size
    vocab = tc.vocab_size
    ids = sorted(draft_ids) if draft_ids is not None else list(range(vocab))
    g = torch.Generator(device).manual_seed(seed)

    def rand(*shape: int, scale: float = std) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    def norm(n: int) -> torch.Tensor:
        return (1 + torch.randn(n, generator=g, device=device) * 0.1).to(dtype)

    layer = {"self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
             "self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
             "self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden), "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
             "input_layernorm.weight": norm(hidden), "hidden_norm.weight": norm(hidden), "post_attention_layernorm.weight": norm(hidden),
             "mlp.gate_proj.weight": rand(inter, hidden), "mlp.up_proj.weight": rand(inter, hidden),
             "mlp.down_proj.weight": rand(hidden, inter)}
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    weights = {prefix + k: v for k, v in layer.items()}
    weights |= {"fc.weight": rand(hidden, 3 * hidden, scale=std / 2), "norm.weight": norm(hidden), "lm_head.weight": rand(len(ids), hidden)}
    d2t = torch.tensor([t - i for i, t in enumerate(ids)], dtype=torch.long, device="cpu")
    t2d = torch.zeros(vocab, dtype=torch.bool, device="cpu")
    t2d[ids] = True
    weights |= {"d2t": d2t, "t2d": t2d}
    if own_embed:
        weights["embed_tokens.weight"] = rand(vocab, hidden, scale=1.0)
    weights = {k: v.contiguous().cpu() for k, v in weights.items() if k not in drop}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if weights_file.endswith(".bin"):
        torch.save(weights, path / weights_file)
    else:
        save_file(weights, str(path / weights_file))
    llama = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_hidden_layers": 1,
             "hidden_act": "silu", "rms_norm_eps": tc.rms_norm_eps, "max_position_embeddings": tc.max_position_embeddings,
             "vocab_size": vocab, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16"}
    if layout == "eagle":
        config = {**llama, "draft_vocab_size": len(ids), "target_hidden_size": hidden}
        if aux_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": len(ids),
                  "norm_before_residual": norm_before_residual, "target_hidden_size": None,
                  "transformer_layer_config": {**llama, "architectures": ["LlamaForCausalLM"]},
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                         "verifier": {"name_or_path": "tiny-target", "architectures": list(tc.architectures or [])}},
                  "speculators_version": "0.2.0"}
        if aux_ids is not None:
            config["eagle_aux_hidden_state_layer_ids"] = aux_ids
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x (heads, t, d) at positions 0..t-1 (rotate-half convention)."""
    d, t = x.shape[-1], x.shape[-2]
    inv_freq = 1 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d)
    freqs = torch.arange(t, dtype=torch.float64, device="cpu")[:, None] * inv_freq
    cos, sin = torch.cat([freqs.cos(), freqs.cos()], -1).to(x), torch.cat([freqs.sin(), freqs.sin()], -1).to(x)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def reference_drafts(head_dir: Path, target, tokens: list[int], gamma: int) -> list[int]:
    """The greedy drafts after ``tokens`` by the reference forward, from the raw checkpoint: the target's
    ``hidden_states`` (fp64), the whole head sequence recomputed for every draft, no cache."""
    from safetensors.torch import load_file

    config = json.loads((Path(head_dir) / "config.json").read_text())
    layer_config = config.get("transformer_layer_config", config)
    file = Path(head_dir) / "model.safetensors"
    tensors = load_file(str(file)) if file.is_file() else torch.load(Path(head_dir) / "pytorch_model.bin", weights_only=True)
    raw = {k: v.double().cpu() if v.is_floating_point() else v.cpu() for k, v in tensors.items()}
    p = "midlayer." if any(k.startswith("midlayer.") for k in raw) else "layers.0."
    eps, theta = layer_config["rms_norm_eps"], layer_config.get("rope_theta", 10000.0)
    heads, kv_heads, d = layer_config["num_attention_heads"], layer_config["num_key_value_heads"], layer_config["head_dim"]
    n_layers = target.config.num_hidden_layers
    explicit = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    aux = sorted(explicit or [2, n_layers // 2, n_layers - 3])
    nbr = bool(config.get("norm_before_residual", False))
    with torch.no_grad():
        out = target(input_ids=torch.tensor([tokens[:-1]], device=target.device), output_hidden_states=True)
    hs = torch.cat([out.hidden_states[j][0].double().cpu() for j in aux], -1)
    g = hs @ raw["fc.weight"].T
    embed = raw["embed_tokens.weight"] if "embed_tokens.weight" in raw else target.model.embed_tokens.weight.double().cpu()
    states, inputs, drafts = list(g), list(tokens[1:]), []
    for _ in range(gamma):
        s, e = torch.stack(states), embed[torch.tensor(inputs, device="cpu")]
        t = s.shape[0]
        normed = _rms(s, raw[p + "hidden_norm.weight"], eps)
        x = torch.cat([_rms(e, raw[p + "input_layernorm.weight"], eps), normed], -1)
        q = _rope((x @ raw[p + "self_attn.q_proj.weight"].T).view(t, heads, d).transpose(0, 1), theta)
        k = _rope((x @ raw[p + "self_attn.k_proj.weight"].T).view(t, kv_heads, d).transpose(0, 1), theta)
        v = (x @ raw[p + "self_attn.v_proj.weight"].T).view(t, kv_heads, d).transpose(0, 1)
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        scores = (q @ k.transpose(1, 2)) / d ** 0.5 + torch.full((t, t), float("-inf"), dtype=torch.float64, device="cpu").triu(1)
        y = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, -1) @ raw[p + "self_attn.o_proj.weight"].T
        h = (normed if nbr else s) + y
        m = _rms(h, raw[p + "post_attention_layernorm.weight"], eps)
        h = h + (torch.nn.functional.silu(m @ raw[p + "mlp.gate_proj.weight"].T) * (m @ raw[p + "mlp.up_proj.weight"].T)) \
            @ raw[p + "mlp.down_proj.weight"].T
        logits = _rms(h[-1], raw["norm.weight"], eps) @ raw["lm_head.weight"].T
        index = int(logits.argmax())
        drafts.append(index + int(raw["d2t"][index]))
        states.append(h[-1])
        inputs.append(drafts[-1])
    return drafts
