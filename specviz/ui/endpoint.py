"""The programmable endpoint: ``api_name="generate"`` takes a prompt and a settings object (DecodeConfig's names) and
returns the CLI's ``--json`` object, so a running app or a Space is usable from a script:

    from gradio_client import Client
    result = Client("http://127.0.0.1:7860/").predict("Explain rainbows.", {"draft": "head", "gamma": 3}, api_name="/generate")
"""

from __future__ import annotations

import time
from typing import Any

import gradio as gr

from specviz.analysis.result import run_to_result
from specviz.api import keyword
from specviz.core.errors import ConfigError, ModelLoadError
from specviz.runtime.config import APP_MAX_NEW_TOKENS, DecodeConfig, respelled
from specviz.runtime.prepare import plan, prepare
from specviz.ui.bank import shared_models
from specviz.ui.gpu import decode_seconds, gpu, observe_speed
from specviz.ui.stream import on_model_thread


def generate_seconds(prompt: str, config: DecodeConfig) -> int:
    """The GPU time a ``generate`` call asks for (ZeroGPU's ``duration``)."""
    return decode_seconds(config.max_new_tokens)


@gpu(duration=generate_seconds)
def decode(prompt: str, config: DecodeConfig) -> dict:
    """One decode on the GPU side: a validated config in, the CLI's JSON object out."""
    start = time.perf_counter()
    result = on_model_thread(lambda: run_to_result(prepare(config, prompt, shared_models().bank)))
    observe_speed(result["metrics"]["new_tokens"], time.perf_counter() - start)
    return result


def generate(prompt: str, settings: dict[str, Any] | None = None) -> dict:
    """Decode ``prompt`` with ``settings`` (DecodeConfig's names: draft, gamma, gamma_policy, accept, temperature, seed,
    max_new_tokens, …) and return the CLI's --json object: text, token_ids, config, metrics, steps and theory."""
    if settings is not None and not isinstance(settings, dict):
        raise gr.Error("settings must be a JSON object of DecodeConfig's names, e.g. {\"gamma\": 3}")
    try:
        config = DecodeConfig.from_values(settings or {})
        if config.max_new_tokens > APP_MAX_NEW_TOKENS:
            raise ConfigError(f"max_new_tokens is at most {APP_MAX_NEW_TOKENS} here, got {config.max_new_tokens}")
        plan(config, prompt, shared_models().bank)  # settings and prompt checked here, before asking for a GPU
        shared_models().load_weights(config)
        return decode(prompt, config)
    except ConfigError as exc:
        raise gr.Error(str(respelled(exc, keyword))) from None
    except ModelLoadError as exc:
        raise gr.Error(str(exc)) from None
