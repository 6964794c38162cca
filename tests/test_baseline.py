"""One AR baseline for every kind of run, and API errors that name the API's keyword arguments (fast: no model runs)."""

from dataclasses import fields

import pytest

import specviz
from specviz.core.registry import ACCEPT_RULES, GAMMA_POLICIES
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import BASELINE_SETTINGS, baseline_config

SAMPLING = {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_new_tokens": 20, "chat": False}
RUNS = {
    "single draft": {"draft": "ngram"},
    "select": {"select": ["head", "ngram"], "gamma_policy": "online"},
    "chain": {"chain": ["ngram", "draft-s"], "level_gamma": 2},
    "ar": {"method": "ar"},
    **{f"rule {r}": {"accept": r, "judge_threshold": 0.3, "lenience": 0.5, "topk": 3} for r in ACCEPT_RULES},
    **{f"policy {p}": {"gamma_policy": p, "gamma": 5} for p in GAMMA_POLICIES},
}


@pytest.mark.parametrize("settings", RUNS.values(), ids=RUNS)
def test_every_run_has_the_same_baseline_keeping_only_what_the_target_reads(settings):
    config = DecodeConfig(**SAMPLING, **settings).validate()
    base = baseline_config(config)
    assert base == baseline_config(DecodeConfig(**SAMPLING))
    assert base.method == "ar" and base.draft is None and not base.chain and not base.select
    for f in fields(DecodeConfig):
        expected = getattr(config, f.name) if f.name in BASELINE_SETTINGS else getattr(DecodeConfig(), f.name)
        assert getattr(base, f.name) == expected or f.name == "method", f.name


@pytest.mark.parametrize("settings, message", [
    ({"select": ["head", "ngram"], "method": "ar"}, "select= chooses the draft per step: use it with method= sd and without draft="),
    ({"chain": ["draft-s", "ngram"]}, "chain=: the n-gram drafter can only be the first"),
    ({"gamma": 0}, "gamma= must be between 1 and 10, got 0"),
    ({"gamma": "three"}, "gamma= must be a number"),
    ({"max_new_tokens": None}, "max_new_tokens= is empty"),
    ({"gamma_policy": "bogus"}, "gamma_policy= must be one of"),
])
def test_api_errors_name_keyword_arguments(settings, message):
    with pytest.raises(specviz.ConfigError) as info:
        specviz.speculate("hi", **settings)
    assert message in str(info.value) and "--" not in str(info.value)
    with pytest.raises(specviz.ConfigError, match=message.split(" ")[0]):
        list(specviz.stream("hi", **settings))


def test_one_gamma_cap_for_the_setting_and_the_adaptive_policies():
    from specviz.core.policy import MAX_GAMMA
    from specviz.methods.policies import OnlinePolicy, RLPolicy, make_policy

    assert DecodeConfig.settings()["gamma"].high == MAX_GAMMA == DecodeConfig.settings()["level_gamma"].high
    DecodeConfig(gamma=MAX_GAMMA).validate()
    with pytest.raises(specviz.ConfigError):
        DecodeConfig(gamma=MAX_GAMMA + 1).validate()
    for name in GAMMA_POLICIES:
        policy = make_policy(name, MAX_GAMMA)
        assert getattr(policy, "gamma_max", policy.gamma) == MAX_GAMMA, name
    assert max(RLPolicy().actions) == MAX_GAMMA == OnlinePolicy().gamma_max
    ignoring = {name for name in GAMMA_POLICIES if "gamma" not in GAMMA_POLICIES.entry(name).params}
    assert ignoring == {"rl", "confidence"}
    assert make_policy("confidence", 2).gamma == make_policy("confidence", 9).gamma
