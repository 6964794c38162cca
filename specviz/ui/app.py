"""The specviz web app: three tabs (Explore, Compare, Explain) over the shared engine, and a fourth (Server) over a
vLLM server.

``build_app()`` returns the Blocks (queue configured); ``launch()`` starts it with the theme and CSS
(gradio 6 takes those in ``launch``) on ``PORT`` / ``GRADIO_SERVER_PORT`` (default 7860).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from specviz.core.env import env
from specviz.ui.bank import Models, default_preset, shared_models
from specviz.ui.compare import build_compare_tab
from specviz.ui.decode import decode_steps
from specviz.ui.endpoint import generate
from specviz.ui.explain import build_explain_tab, explain_update
from specviz.ui.explore import build_explore_tab
from specviz.ui.handlers import decode_concurrency
from specviz.ui.server import build_server_tab
from specviz.ui.teach import KEYS_JS
from specviz.viz.render import status_html, token_css
from specviz.viz.teach import microscope_css

TITLE = "specviz: speculative decoding, step by step"
INTRO = ("A small draft proposes γ tokens, the target checks them all in one forward pass and keeps the longest agreeing run "
         "(plus one token of its own). Watch every step live, race it against plain autoregressive decoding on the same prompt, "
         "compare settings side by side, and see what the theory predicts.")
CSS = "\n".join([token_css(), microscope_css(), (Path(__file__).with_name("style.css")).read_text()])
THEME = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
DEFAULT_CONCURRENCY = 4
"""Light handlers (settings checks, replay, theory plot) run concurrently."""
QUEUE_POLL_S = (0.05, 0.1)
"""How often gradio's queue looks for new events and for progress to send while it waits: gradio's values on Windows.
Elsewhere it polls every GRADIO_POLL_S, and each poll takes the GIL from the model thread between two tensor operations,
which slows every step of a decode the app serves (scripts/measure_queue_poll.py measures by how much)."""
GRADIO_POLL_S = (0.001, 0.01)
"""Gradio's own queue polling off Windows (seconds), which QUEUE_POLL_S replaces."""


def model_status(models: Models | None = None) -> tuple:
    """The status line at the top of the page; the timer stops once models are ready."""
    message, level = (models or shared_models()).status()
    return status_html(message, level), gr.Timer(active=level == "busy")


def build_app() -> gr.Blocks:
    """Build the Blocks (call ``launch`` or ``demo.launch(theme=THEME, css=CSS)`` to serve it)."""
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        session = gr.State(None)
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        models_line = gr.HTML(status_html("Checking models…", "busy"), elem_id="model-status")
        timer = gr.Timer(2.0, active=True)
        with gr.Tabs():
            with gr.Tab("Explore", id="explore"):
                build_explore_tab(session)
            with gr.Tab("Compare", id="compare"):
                build_compare_tab(session)
            with gr.Tab("Explain", id="explain") as explain_tab:
                explain_inputs, explain_outputs = build_explain_tab(session)
            with gr.Tab("Server", id="server"):
                build_server_tab()
        explain_tab.select(explain_update, explain_inputs, explain_outputs, api_visibility="private")
        gr.api(generate, api_name="generate", concurrency_id="decode", concurrency_limit=decode_concurrency())
        timer.tick(model_status, None, [models_line, timer], api_visibility="private", queue=False)
        demo.load(model_status, None, [models_line, timer], api_visibility="private", queue=False)
    demo.queue(default_concurrency_limit=DEFAULT_CONCURRENCY)
    demo._queue.sleep_when_free, demo._queue.progress_update_sleep_when_free = QUEUE_POLL_S  # not settable in queue()
    return demo


def server_port() -> int | None:
    value = env("PORT") or env("GRADIO_SERVER_PORT")
    return int(value) if value else None


def launch(demo: gr.Blocks | None = None, warm_up: bool = True, **kwargs) -> gr.Blocks:
    """Start loading the default preset's models in the background and serve the app."""
    demo = demo or build_app()
    if warm_up:
        shared_models().warm_up(decode_steps, default_preset())
    kwargs.setdefault("server_port", server_port())
    kwargs.setdefault("max_file_size", "32mb")  # an uploaded trace is at most this (specviz.api.MAX_TRACE_BYTES)
    demo.launch(theme=THEME, css=CSS, js=KEYS_JS, **kwargs)
    return demo
