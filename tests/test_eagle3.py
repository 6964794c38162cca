"""Published EAGLE-3 heads (EAGLE and speculators layouts) as drafts: the drafted tokens equal an independent reference
forward, greedy output equals ``generate``, sampled output is the target's distribution, bad checkpoints are refused
in one line, and the CLI takes ``--target DIR --draft HEAD_DIR``."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from specviz.core.drafters import SINGLE_PATH
from specviz.core.engine import decode
from specviz.core.errors import ModelLoadError
from specviz.core.policy import FixedPolicy
from specviz.core.sampling import Sampler
from specviz.core.tree import MAX_TREE_NODES, TreeShape
from specviz.methods.eagle3 import Eagle3Drafter, load_eagle3
from specviz.methods.eagle3_format import head_dir
from specviz.models.backends import cached_model
from specviz.models.backends.graphs import eager_capture
from specviz.models.loading import load_model
from specviz.runtime.prepare import drafter_kind

from .conftest import chi_square_p
from .eagle3_heads import reference_drafts, tiny_target_dir, write_head
from .test_acceptance import exact_two_token_joint
from .test_engine import PROMPTS, reference
from .test_lean import static_storage

HEADS = {  # name: (target family, write_head options)
    "eagle": ("llama", {}),
    "eagle-own-embed-bin": ("llama", {"own_embed": True, "weights_file": "pytorch_model.bin"}),
    "speculators": ("llama", {"layout": "speculators"}),
    "speculators-norm-before-residual": ("llama", {"layout": "speculators", "norm_before_residual": True, "own_embed": True}),
    "eagle-qwen3-explicit-layers": ("qwen3", {"aux_ids": [5, 1, 3]}),
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("targets")
    return {family: tiny_target_dir(root / family, family, seed=i) for i, family in enumerate(("llama", "qwen3"))}


@pytest.fixture(scope="module")
def target_models(targets):
    return {family: load_model(str(path), family, torch.get_default_device(), torch.float32) for family, path in targets.items()}


@pytest.fixture(scope="module")
def heads(tmp_path_factory, target_models):
    """Each head's draft vocabulary: the six tokens the target says most often on the test prompts and two more, so that
    a random head's drafts are sometimes accepted and sometimes not."""
    root = tmp_path_factory.mktemp("heads")
    out = {}
    for name, (family, options) in HEADS.items():
        lm = target_models[family]
        said = Counter(t for p in PROMPTS for t in reference(lm, p, 24))
        likely = {t for t, _ in said.most_common(6)}
        vocab = sorted(likely | set(sorted(set(range(lm.vocab_size)) - likely)[:2]))
        out[name] = write_head(root / name, lm.model.config, draft_ids=vocab, **options)
    return out


def drafter_for(lm, head_path):
    head = load_eagle3(head_path, lm.model)
    return Eagle3Drafter(head, cached_model(lm, taps=head.taps))


def run(lm, drafter, prompt, n, gamma, sampler=None):
    events = list(decode(drafter.target, prompt, drafters=[drafter], policy=FixedPolicy(gamma), sampler=sampler or Sampler(),
                         max_new_tokens=n))
    return [t for e in events for t in e.emitted_ids], events


@pytest.mark.parametrize("name", HEADS)
def test_drafts_equal_the_reference_forward_also_after_rejections(target_models, heads, name):
    lm = target_models[HEADS[name][0]]
    checked, accepted, rejected = 0, 0, 0
    for prompt in PROMPTS:
        _, events = run(lm, drafter_for(lm, heads[name]), prompt, 24, 3)
        tokens = list(prompt)
        for e in events:
            if e.draft_ids:
                assert e.draft_ids == reference_drafts(heads[name], lm.model, tokens, len(e.draft_ids))
                checked, accepted, rejected = checked + 1, accepted + e.accepted, rejected + (e.accepted < len(e.draft_ids))
            tokens += e.emitted_ids
    assert checked >= 20 and accepted > 0 and rejected > 0


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("name", ["eagle", "speculators-norm-before-residual", "eagle-qwen3-explicit-layers"])
def test_greedy_decoding_with_a_published_head_matches_generate(target_models, heads, name, gamma):
    lm = target_models[HEADS[name][0]]
    for prompt in PROMPTS:
        out, events = run(lm, drafter_for(lm, heads[name]), prompt, 40, gamma)
        assert out == reference(lm, prompt, 40)
        assert all(len(e.draft_ids) <= gamma for e in events)


@pytest.mark.parametrize("tree", [SINGLE_PATH, TreeShape(2, "dynamic")])
def test_a_fixed_capacity_head_recorded_per_fed_size_drafts_as_the_growing_one(target_models, heads, tree):
    """The head's cache with static shapes, recorded as graphs (the eager stand-in on a CPU: same buffers, same replays),
    drafts the very tokens of the growing cache, chains and token trees alike, and each fed size is recorded once."""
    lm = target_models["llama"]
    head = load_eagle3(heads["eagle"], lm.model)
    for prompt in PROMPTS:
        capacity = len(prompt) + 32 + 1 + MAX_TREE_NODES
        plain = cached_model(lm, taps=head.taps)
        grown = list(decode(plain, prompt, drafters=[Eagle3Drafter(head, plain)], policy=FixedPolicy(4), max_new_tokens=32, tree=tree))
        target = static_storage(lm, capacity, graphs=True, taps=head.taps)
        static = Eagle3Drafter(head, target, capacity=capacity, capture=eager_capture)
        events = list(decode(target, prompt, drafters=[static], policy=FixedPolicy(4), max_new_tokens=32, tree=tree))
        assert [(e.draft_ids, e.emitted_ids) for e in events] == [(e.draft_ids, e.emitted_ids) for e in grown]
        assert [t for e in events for t in e.emitted_ids] == reference(lm, prompt, 32)
        assert static.graphs.recorded and all(isinstance(t, int) and t >= 1 for t in static.graphs.recorded)
    with pytest.raises(ValueError, match="graphs need static shapes"):
        Eagle3Drafter(head, target, capture=eager_capture)


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_sampling_with_a_published_head_matches_the_target_distribution(tmp_path, layout):
    """Two-token joint of many seeded runs against the target's exact joint (10-token vocabulary, 6 in the draft's)."""
    from transformers import AutoModelForCausalLM

    path = tiny_target_dir(tmp_path / "t", "llama", vocab=10, hidden=32, layers=4, heads=2, kv_heads=1, seed=3, std=0.3)
    lm = load_model(str(path), "t", torch.get_default_device(), torch.float32)
    head = write_head(tmp_path / "h", lm.model.config, layout=layout, draft_ids=[0, 2, 3, 5, 7, 8], std=0.5)
    prompt, n = [3, 1, 4], 1500
    reference_lm = type("LM", (), {"model": AutoModelForCausalLM.from_pretrained(path).eval().to(lm.device), "vocab_size": 10})
    joint = exact_two_token_joint(reference_lm, prompt, 1.0, 1.0).flatten()
    counts = torch.zeros_like(joint)
    loaded = load_eagle3(head, lm.model)
    for seed in range(n):
        out, _ = run(lm, Eagle3Drafter(loaded, cached_model(lm, taps=loaded.taps)), prompt, 2, 3, Sampler(1.0, 1.0, seed, lm.device))
        counts[out[0] * 10 + out[1]] += 1
    keep = joint * n >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    expected = torch.cat([joint[keep], joint[~keep].sum(0, keepdim=True)]) * n
    assert chi_square_p(observed, expected) > 1e-3


def test_sampled_drafts_come_from_q_on_the_draft_vocabulary(target_models, heads):
    lm = target_models["llama"]
    drafter = drafter_for(lm, heads["eagle"])
    drafter.read_states(0, drafter.target.forward(PROMPTS[0][:-1]).layers)
    draft = drafter.draft(PROMPTS[0], 5, 5, SINGLE_PATH, Sampler(1.0, 1.0, 3, lm.device))
    raw = load_file(str(heads["eagle"] / "model.safetensors"))
    ids = (torch.arange(raw["d2t"].shape[0], device="cpu") + raw["d2t"]).tolist()
    torch.testing.assert_close(draft.q[:, ids].sum(-1).cpu(), torch.ones(5, device="cpu"))
    assert all(t in ids and q > 0 for t, q in zip(draft.ids, draft.q_of_ids()))


def test_the_run_picks_the_eagle3_kind_for_a_head_directory(heads, targets):
    assert drafter_kind(str(heads["speculators"])) is Eagle3Drafter
    assert head_dir(str(targets["llama"])) is None  # a plain model is not a head
    assert drafter_kind(str(targets["llama"])).__name__ == "ModelDrafter"


BAD = {
    "a hidden size that does not match": ({"hidden": 32}, "hidden size is 64"),
    "no d2t for a smaller draft vocabulary": ({"drop": ("d2t",)}, "no d2t"),
    "an unknown layout": ({"drop": ("midlayer.hidden_norm.weight",)}, "unknown layout"),
    "another family's vocabulary": ({"vocab": 120}, "drafts only for its own target family"),
    "no weights": ({"weights_file": "weights.pt"}, "has no model.safetensors or pytorch_model.bin"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_head_that_cannot_be_used_is_refused_in_one_line(tmp_path, target_models, case):
    from transformers import LlamaConfig

    options, message = BAD[case]
    lm = target_models["llama"]
    c = lm.model.config
    config = LlamaConfig(vocab_size=options.pop("vocab", c.vocab_size), hidden_size=options.pop("hidden", c.hidden_size),
                         intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
                         num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, max_position_embeddings=512)
    path = write_head(tmp_path / "h", config, draft_ids=list(range(0, config.vocab_size, 2)), **options)
    with pytest.raises(ModelLoadError, match=message) as error:
        load_eagle3(path, lm.model)
    assert "\n" not in str(error.value)


def test_a_speculators_head_of_another_architecture_is_refused(tmp_path, target_models, heads):
    config = json.loads((heads["speculators"] / "config.json").read_text())
    config["speculators_config"]["verifier"]["architectures"] = ["Qwen3ForCausalLM"]
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    (tmp_path / "h" / "model.safetensors").write_bytes((heads["speculators"] / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="drafts only for its own target family"):
        load_eagle3(tmp_path / "h", target_models["llama"].model)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specviz", "generate", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle", "speculators-norm-before-residual", "eagle-qwen3-explicit-layers"])
def test_cli_contract_with_a_target_directory_and_a_head_directory(targets, target_models, heads, name):
    family = HEADS[name][0]
    prompt = "t5 t17 t3 t9 t5 t17"
    ar = cli("--target", str(targets[family]), "--method", "ar", "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "24",
             "--json")
    sd = cli("--target", str(targets[family]), "--draft", str(heads[name]), "--gamma", "3", "--prompt", prompt, "--temperature", "0",
             "--max-new-tokens", "24", "--json")
    assert ar.returncode == 0 and sd.returncode == 0, ar.stderr + sd.stderr
    ar_out, sd_out = json.loads(ar.stdout), json.loads(sd.stdout)
    assert sd_out["token_ids"] == ar_out["token_ids"] and len(sd_out["token_ids"]) == 24
    assert any(s["draft_ids"] for s in sd_out["steps"]) and all("emitted_ids" in s for s in sd_out["steps"])


@pytest.mark.parametrize("args, message", [
    (("--draft", "/nonexistent/head"), "unknown draft"),
    (("--draft", "nobody/no-such-eagle3-head"), "cannot load model 'nobody/no-such-eagle3-head'"),
    (("--target", "/nonexistent/model"), "cannot load"),
    (("--target", "nobody/no-such-model"), "cannot load"),
])
def test_a_missing_directory_or_unreachable_hub_id_is_one_line_and_exit_2(targets, args, message):
    target = () if "--target" in args else ("--target", str(targets["llama"]))
    out = cli(*target, *args, "--prompt", "t1 t2", "--max-new-tokens", "2")
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_on_zerogpu_the_default_preset_is_the_gpu_preset_with_its_head(monkeypatch):
    from specviz.models.presets import GPU_PRESET, PRESETS, default_preset

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert default_preset() == GPU_PRESET and next(iter(PRESETS[GPU_PRESET].drafts)) == "eagle3"
    monkeypatch.delenv("SPACES_ZERO_GPU")
    assert default_preset() != GPU_PRESET


def test_a_gated_preset_without_hf_token_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = subprocess.run([sys.executable, "-m", "specviz", "generate", "--preset", "llama3.1-8b", "--prompt", "hi"], capture_output=True,
                         text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "HF_TOKEN"})
    assert out.returncode == 2 and "is gated" in out.stderr and "HF_TOKEN" in out.stderr and len(out.stderr.strip().splitlines()) == 1
