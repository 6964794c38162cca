"""A local run's speculation as a serving engine takes it: vLLM's ``--speculative-config`` JSON and SGLang's flags,
for the drafts those engines serve (the n-gram drafter, a draft model, a published EAGLE-3 head). A run they cannot
reproduce (a chain, draft selection, a token tree, a relaxed acceptance rule, specviz's own feature head) gets the
reason instead."""

from __future__ import annotations

from specviz.core.drafters import NGramDrafter
from specviz.core.errors import ModelLoadError
from specviz.methods.eagle3 import Eagle3Drafter
from specviz.methods.feature_head import FeatureDrafter
from specviz.runtime.config import DecodeConfig, option
from specviz.runtime.prepare import drafter_kind, run_drafts, run_preset

NGRAM_RANGE = (1, 3)
"""The suffix lengths specviz's n-gram drafter matches (shortest, longest)."""

SERVING_KEYS = {
    "vllm_speculative_config": "vLLM's `--speculative-config` JSON object for this run's draft and γ",
    "sglang_args": "SGLang's `launch_server` flags for the same",
    "unsupported": "why neither engine can run this configuration (then the two keys above are absent)",
}
"""The keys of :func:`serving_export` (the docs render this table)."""


def serving_export(config: DecodeConfig) -> dict:
    """vLLM's ``--speculative-config`` and SGLang's flags for ``config``'s draft at its γ, or ``{"unsupported": why}``.

    A draft's path is the one specviz read: a directory or hub id the serving machine must also reach."""
    config = config.validate()
    why = _unsupported(config)
    if why:
        return {"unsupported": why}
    try:
        (name, source), = run_drafts(config, run_preset(config))
    except ModelLoadError as exc:  # a draft passed as a loaded model object, or a name no longer resolvable
        return {"unsupported": str(exc)}
    kind, gamma = drafter_kind(source), config.gamma
    if issubclass(kind, NGramDrafter):  # vLLM proposes as ngram-earliest does; ngram continues the latest match
        low, high = NGRAM_RANGE
        vllm = {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_max": high, "prompt_lookup_min": low}
        sglang = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(gamma + 1),
                  "--speculative-ngram-min-match-window-size", str(low), "--speculative-ngram-max-match-window-size", str(high)]
        return {"vllm_speculative_config": vllm, "sglang_args": sglang}
    if kind is FeatureDrafter:
        return {"unsupported": f"draft '{name}' is specviz's own feature head, a layout neither vLLM nor SGLang reads "
                               "(a published EAGLE-3 head is exported)"}
    method, algorithm = ("eagle3", "EAGLE3") if kind is Eagle3Drafter else ("draft_model", "STANDALONE")
    vllm = {"method": method, "model": str(source), "num_speculative_tokens": gamma}
    sglang = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(source),
              "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
              str(gamma + 1)]
    return {"vllm_speculative_config": vllm, "sglang_args": sglang}


def _unsupported(config: DecodeConfig) -> str:
    if config.method != "sd":
        return "an autoregressive run has no speculation to export"
    if config.chain:
        return f"{option('chain')}: a polybasic chain has no serving-engine equivalent"
    if config.select:
        return f"{option('select')}: serving engines run one drafter, not a choice per step"
    if config.tree_nodes:
        return f"{option('tree_nodes')}: token trees are exported for chains only (one draft, γ tokens a step)"
    if config.accept != "exact":
        return f"{option('accept')} {config.accept}: serving engines verify with the exact (lossless) rule only"
    if config.gamma_policy != "fixed":
        return (f"{option('gamma_policy')} {config.gamma_policy}: serving engines draft a fixed γ; export a run with "
                f"{option('gamma_policy')} fixed")
    return ""
