"""The Python API: models passed as objects decode exactly like ``generate``, the Trace's views, and one-line
errors for every mistake a caller can make."""

import pytest
import torch

import specviz
from specviz.core.registry import GAMMA_POLICIES
from specviz.models.loading import converted_gguf_dir
from specviz.models.paths import ASSETS
from specviz.runtime.prepare import baseline_config
from specviz.viz.render import legend_html, spans_html

pytestmark = pytest.mark.slow
PROMPTS = ["Write a haiku about autumn leaves.", "What is 17 times 23? Explain the steps."]


@pytest.fixture(scope="module")
def hf_models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = converted_gguf_dir()
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(ASSETS / "models" / "smollm2-draft-s", dtype=torch.float32).eval()
    return target, draft, AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_loaded_models_give_generates_tokens(hf_models, prompt):
    target, draft, tokenizer = hf_models
    # a fixed γ: with these two stock-kernel models `online` may rightly find plain steps faster and stop drafting
    trace = specviz.speculate(prompt, target=target, tokenizer=tokenizer, draft=draft, gamma=3, gamma_policy="fixed", temperature=0,
                              max_new_tokens=40)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        reference = target.generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1]:].tolist()
    assert trace.token_ids == reference
    assert sum(len(s.draft_ids) for s in trace.steps) > 0 and trace.metrics["accept_rate"] > 0  # the draft really drafted
    assert all(s.drafter == "smollm2-draft-s" for s in trace.steps if s.draft_ids)


def test_a_trace_has_the_clis_json_a_dataframe_a_figure_and_an_inline_view():
    trace = specviz.speculate("Name three colours.", draft="ngram", gamma=2, max_new_tokens=12, baseline=True, transformers=True)
    data = trace.to_json()
    assert set(data) == {"text", "token_ids", "config", "metrics", "steps", "theory", "machine", "source", "serving"}
    assert data["token_ids"] == trace.token_ids and data["source"] is None  # this process's engine, not a server
    assert "--gamma-policy online" in data["serving"]["unsupported"]  # serving engines draft a fixed γ
    assert "threads, torch" in data["machine"] and "linear kernels by rows: 1 " in data["machine"]  # the fp32 CPU target's plan
    assert len(trace.to_dataframe()) == len(trace.steps) == data["metrics"]["target_forwards"]
    assert trace.baseline.token_ids == trace.token_ids  # greedy SD is lossless
    assert trace.speedup == pytest.approx(trace.metrics["tokens_per_s"] / trace.baseline.metrics["tokens_per_s"])
    assert [s.name.split(" — ")[0] for s in trace.figure().data][-2:] == ["autoregressive", "transformers' generate"]
    view = trace._repr_html_()
    assert sum(s.kind not in ("rejected", "unchecked") for s in trace.spans) == len(trace.token_ids)
    assert spans_html(trace.spans) in view
    assert "speedup vs AR" in view and legend_html() in view
    generate = trace.transformers  # transformers' generate beside the baseline, on its stock kernels
    assert generate["new_tokens"] == 12 and isinstance(generate["same_tokens_as_ar"], bool) and "stock" in generate["kernels"]
    assert f"{trace.metrics['tokens_per_s'] / generate['tokens_per_s']:.2f}×" in view and "speedup vs transformers" in view
    with pytest.raises(specviz.ConfigError, match="pass baseline=True too"):
        specviz.speculate("Name three colours.", transformers=True)


BASELINE_RUNS = {
    "single draft": {"draft": "draft-s"},
    "select": {"select": ["head", "ngram"], "gamma_policy": "online"},
    "chain": {"chain": ["ngram", "draft-s"]},
    "judge": {"accept": "judge", "draft": "draft-s"},
    "sampling": {"temperature": 0.8, "seed": 3, "draft": "ngram"},
    **{f"policy {p}": {"gamma_policy": p, "draft": "ngram"} for p in GAMMA_POLICIES},
}


@pytest.mark.parametrize("settings", BASELINE_RUNS.values(), ids=BASELINE_RUNS)
def test_every_method_returns_its_baseline(settings):
    trace = specviz.speculate("Name three colours.", max_new_tokens=6, baseline=True, **settings)
    base = trace.baseline
    assert base is not None and base.config == baseline_config(trace.config) and trace.speedup is not None
    assert base.steps and not any(s.draft_ids for s in base.steps) and base.metrics["new_tokens"] == 6
    assert trace.to_dict()["baseline"]["config"]["method"] == "ar"
    if trace.config.temperature == 0 and trace.config.accept == "exact":
        assert base.token_ids == trace.token_ids  # greedy exact SD is lossless


def test_stream_yields_the_steps_speculate_records():
    settings = {"draft": "ngram", "gamma": 2, "gamma_policy": "fixed", "max_new_tokens": 10}  # γ independent of timing
    events = list(specviz.stream("Count to five.", **settings))
    trace = specviz.speculate("Count to five.", **settings)
    assert [e.emitted_ids for e in events] == [s.emitted_ids for s in trace.steps]


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"gamma": 0}, specviz.ConfigError, "gamma= must be between"),
    ({"gamma_policy": "bogus"}, specviz.ConfigError, "gamma_policy= must be one of"),
    ({"colour": "red"}, specviz.ConfigError, "unknown setting 'colour'"),
    ({"draft": 3.5}, specviz.ConfigError, "draft must be"),
    ({"draft": "no-such-draft"}, specviz.ModelLoadError, "unknown draft"),
    ({"target": "no-such-preset-or-dir"}, specviz.ModelLoadError, "neither a local directory nor a hub id"),
    ({"target": object()}, specviz.ConfigError, "target must be"),
    ({"draft": "ngram", "method": "ar"}, specviz.ConfigError, "draft= is for speculative decoding"),
])
def test_mistakes_raise_one_line_errors(kwargs, error, fragment):
    with pytest.raises(error, match=fragment) as info:
        specviz.speculate("hi", max_new_tokens=4, **kwargs)
    assert "\n" not in str(info.value)


def test_a_loaded_target_needs_its_tokenizer(hf_models):
    with pytest.raises(specviz.ConfigError, match="needs its tokenizer"):
        specviz.speculate("hi", target=hf_models[0], max_new_tokens=4)
