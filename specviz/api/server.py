"""A run on a vLLM server as a :class:`~specviz.api.trace.Trace`: the prompt goes to the server's chat endpoint with
the run's sampling settings, and its per-request speculation becomes the trace's steps, with the server as the
trace's ``source``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from specviz.api.trace import Trace, trace_of
from specviz.core.errors import ConfigError, ServerError
from specviz.core.policy import MAX_GAMMA
from specviz.models.vllm_client import DEFAULT_TIMEOUT_S, ServerTokenizer, VllmClient
from specviz.models.vllm_steps import read_answer
from specviz.runtime.config import DecodeConfig, option
from specviz.runtime.prepare import RunPlan

DRAFTER = "vllm"
"""The drafter's name in a server's steps: the server does not say which drafter it runs."""


def server_trace(prompt: str, url: str, model: str | None = None, config: DecodeConfig | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, speculative_config: dict | None = None,
                 progress: Callable[[list[int], str], None] | None = None) -> Trace:
    """Run ``prompt`` on the vLLM server at ``url`` (its only model, or ``model``) with ``config``'s sampling settings
    (temperature, top-p, seed, max new tokens; the chat template is the server's) and return the run's Trace.
    A server that does not answer, is not vLLM, runs without speculation or per-request metrics, or sends what does
    not add up raises a one-line ServerError; a bad setting a ConfigError. ``speculative_config``: the server's
    ``--speculative-config``, where known: kept in the trace's source, and an n-gram server's steps are placed by
    replaying its rule (vLLM lists no step that drafted nothing). ``progress``: the answer is streamed, and
    ``progress(ids, text)`` hears the answer so far as it arrives (the steps come with the final chunk)."""
    config = (config or DecodeConfig()).validate()
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")
    if not config.chat:
        raise ConfigError(f"a server run sends the prompt as a chat message: {option('chat')} cannot be turned off")
    if config.method != "sd":
        raise ConfigError(f"a server run decodes with the server's speculation: {option('method')} {config.method} "
                          "is for local runs")
    if speculative_config is not None and not isinstance(speculative_config, dict):
        raise ConfigError("the server's speculative config is a JSON object, as given to vLLM's --speculative-config")
    if not timeout > 0:
        raise ConfigError(f"the server timeout must be positive, got {timeout}")
    client = VllmClient(url, timeout)
    name = client.model(model)
    version = client.version()
    started = time.perf_counter()
    sampling = dict(max_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p, seed=config.seed)
    body = (client.chat(name, prompt, **sampling) if progress is None
            else client.chat_streamed(name, prompt, **sampling, on_tokens=progress))
    answer = read_answer(body, DRAFTER, 1e3 * (time.perf_counter() - started), speculative_config)
    spec = answer.spec
    told = (speculative_config or {}).get("num_speculative_tokens", spec["num_spec_tokens"])
    if told != spec["num_spec_tokens"]:
        raise ServerError(f"the speculative config given says num_speculative_tokens {told}, the server drafts up to "
                          f"{spec['num_spec_tokens']}: it is not the server's")
    gamma = spec["num_spec_tokens"] if 1 <= spec["num_spec_tokens"] <= MAX_GAMMA else config.gamma
    run_config = replace(config, target=name, draft=DRAFTER, gamma=gamma, gamma_policy="fixed", chain=[], select=[],
                         tree_nodes=0).validate()
    plan = RunPlan(run_config, ServerTokenizer(client, name), answer.prompt_ids, name)
    trace = trace_of(prompt, plan, answer.steps, f"vLLM {version} at {client.url}")
    trace.text = answer.text
    trace.serving = None
    trace.source = {"url": client.url, "engine": "vllm", "version": version, "model": name,
                    "speculative_config": speculative_config or {"num_speculative_tokens": spec["num_spec_tokens"]},
                    "speculative_decoding": {k: v for k, v in spec.items() if not k.startswith("per_step")},
                    "finish_reason": answer.finish_reason, "timing": answer.timing}
    return trace
