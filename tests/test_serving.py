"""A local run's speculation as vLLM and SGLang take it (``serving`` in ``--json``): the drafts they serve get their
config at the run's γ, every other run the reason it cannot be exported."""

import pytest
from transformers import LlamaConfig

from specviz.api.trace import Trace
from specviz.models.presets import BUNDLED_DRAFTS
from specviz.runtime.config import DecodeConfig
from specviz.runtime.serving import NGRAM_RANGE, serving_export
from tests.eagle3_heads import write_head

FIXED = {"gamma_policy": "fixed", "gamma": 4}


def test_the_ngram_drafter_exports_specvizs_suffix_range():
    out = serving_export(DecodeConfig(draft="ngram", **FIXED))
    assert out["vllm_speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4,
                                              "prompt_lookup_max": NGRAM_RANGE[1], "prompt_lookup_min": NGRAM_RANGE[0]}
    assert out["sglang_args"][:4] == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]


@pytest.mark.parametrize("name", ["draft-s", "draft-m"])
def test_a_bundled_draft_model_exports_its_directory(name):
    out = serving_export(DecodeConfig(draft=name, **FIXED))
    assert out["vllm_speculative_config"] == {"method": "draft_model", "model": BUNDLED_DRAFTS[name], "num_speculative_tokens": 4}
    args = out["sglang_args"]
    assert args[args.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert args[args.index("--speculative-draft-model-path") + 1] == BUNDLED_DRAFTS[name]
    assert args[args.index("--speculative-num-steps") + 1] == "4" and args[args.index("--speculative-num-draft-tokens") + 1] == "5"


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_a_published_eagle3_head_exports_as_eagle3(tmp_path, layout):
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16)
    head = write_head(tmp_path / "head", config, layout=layout)
    out = serving_export(DecodeConfig(draft=str(head), **FIXED))
    assert out["vllm_speculative_config"] == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 4}
    assert out["sglang_args"][:2] == ["--speculative-algorithm", "EAGLE3"]


@pytest.mark.parametrize("settings, fragment", [
    ({"draft": "head", **FIXED}, "specviz's own feature head"),
    ({"draft": "draft-m"}, "--gamma-policy online"),
    ({"chain": ["ngram", "draft-s"], **FIXED}, "--chain"),
    ({"select": ["ngram", "draft-s"], **FIXED}, "--select"),
    ({"draft": "draft-m", "tree_nodes": 8, "gamma_policy": "fixed"}, "--tree-nodes"),
    ({"draft": "draft-m", "accept": "topk", **FIXED}, "--accept topk"),
    ({"method": "ar"}, "autoregressive"),
    ({"draft": "no-such-draft", **FIXED}, "unknown draft"),
])
def test_what_no_serving_engine_runs_gets_the_reason(settings, fragment):
    out = serving_export(DecodeConfig(**settings))
    assert list(out) == ["unsupported"] and fragment in out["unsupported"]


def test_a_trace_file_keeps_serving_and_source(tmp_path):
    from specviz.api.trace import load_trace

    serving = serving_export(DecodeConfig(draft="ngram", **FIXED))
    source = {"url": "http://127.0.0.1:1", "engine": "vllm", "version": "0.32.0", "model": "m"}
    trace = Trace("p", DecodeConfig(draft="ngram", **FIXED), "", [], [], {}, None, serving=serving, source=source)
    again = load_trace(trace.save(tmp_path / "t.json"))
    assert (again.serving, again.source) == (serving, source)
    assert set(trace.to_json()) == set(Trace.JSON_KEYS)
