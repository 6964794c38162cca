"""Server tab: a run on a vLLM server (a URL and a model), drawn as the same token view and step table as a local
run, with what the server does not tell said beside it. The request runs in its own queue, so a slow server never
holds up the app's decodes; every failure is a visible one-line message."""

from __future__ import annotations

import html
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import gradio as gr
import pandas as pd

from specviz.api.server import server_trace
from specviz.api.trace import Trace
from specviz.core.errors import ConfigError
from specviz.models.vllm_client import DEFAULT_TIMEOUT_S
from specviz.models.vllm_steps import UNTOLD
from specviz.runtime.config import DecodeConfig
from specviz.ui.handlers import default_prompt, guarded
from specviz.ui.runs import save_trace_files
from specviz.viz import charts
from specviz.viz.render import headline_html, legend_html, spans_html, status_html
from specviz.viz.teach import UNTOLD_WORDS
from specviz.viz.trace import STEP_COLUMNS, TraceBuilder

SERVER_CONCURRENCY = 4
"""Server requests in flight at once: they wait on the network, not on this machine's cores."""
DEFAULT_URL = "http://127.0.0.1:8011"
"""Where ``make vllm`` serves."""


def untold_note(trace: Trace) -> str:
    """What the server's steps do not say, in words."""
    told = sorted({u for s in trace.steps for u in (s.untold or [])}, key=UNTOLD.index)
    source = trace.source or {}
    where = f"vLLM {source.get('version', '?')} at {source.get('url', '?')}, model {source.get('model', '?')}"
    config = json.dumps(source.get("speculative_config", {}))
    missing = ", ".join(UNTOLD_WORDS[u] for u in told)
    return (f"Ran on {where}; speculative config {config}. The server does not tell {missing}: "
            "a `?` is a draft it rejected without naming it, and its steps' times are zero (the run's total is its own).")


def step_rows(trace: Trace) -> pd.DataFrame:
    builder = TraceBuilder(_Pieces(trace.pieces), [])
    builder.add_all(trace.steps)
    return pd.DataFrame(builder.rows, columns=STEP_COLUMNS)


class _Pieces:
    """A tokenizer made of a trace's token texts (the server's, fetched once by the run)."""

    def __init__(self, pieces: dict[int, str]):
        self.pieces = pieces

    def decode(self, ids: list[int], **_: object) -> str:
        return "".join(self.pieces.get(i, "") for i in ids)


def streamed(run: Callable[[Callable[[list[int], str], None]], Trace], every_s: float = 0.15) -> Iterator[tuple[int, str] | Trace]:
    """``run(progress)`` on a thread of its own (the request waits on the network, not on this machine's cores): the
    answer so far as (tokens, text), at most every ``every_s`` seconds while it streams, then the Trace; its failure
    is raised here."""
    updates: queue.Queue = queue.Queue()
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["trace"] = run(lambda ids, text: updates.put((len(ids), text)))
        except BaseException as exc:  # raised in the handler's thread, below
            outcome["error"] = exc
        finally:
            updates.put(None)

    threading.Thread(target=work, daemon=True, name="specviz-server-run").start()
    latest, shown = None, 0.0
    while (item := updates.get()) is not None:
        latest = item
        if time.perf_counter() - shown >= every_s:
            shown = time.perf_counter()
            yield latest
    if "error" in outcome:
        raise outcome["error"]
    yield outcome["trace"]


def run_on_server(url: str, model: str, spec: str, prompt: str, max_new_tokens: float, temperature: float,
                  timeout: float) -> Iterator[tuple]:
    """Status first, the answer as it streams in, then the run's headline, tokens, note, dynamics (per-position
    acceptance, drafts kept by draft length, what each γ would give), step table and trace files."""
    def frames() -> Iterator[tuple]:
        where = url.strip() or "the server"
        yield status_html(f"Waiting for {where}…", "busy"), *(gr.skip(),) * 6
        try:
            speculative = json.loads(spec) if spec and spec.strip() else None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"the speculative config is not JSON ({exc.msg})") from None
        config = DecodeConfig.from_values({"max_new_tokens": max_new_tokens, "temperature": temperature})
        for got in streamed(partial(server_trace, prompt, url, model.strip() or None, config, float(timeout), speculative)):
            if isinstance(got, Trace):
                trace = got
                break
            count, text = got
            yield (status_html(f"Receiving from {where}: {count} of at most {config.max_new_tokens} tokens; its steps "
                               "come with the last chunk…", "busy"), gr.skip(),
                   f"<div class='sv-tokens sv-streaming'>{html.escape(text)}</div>", *(gr.skip(),) * 4)
        m, data = trace.metrics, trace.to_dict()
        yield (status_html(f"{m['new_tokens']} tokens in {len(trace.steps)} steps; {m['accepted']} of {m['drafted']} "
                           "drafts accepted", "ok"),
               headline_html(trace.headline()), legend_html() + f"<div class='sv-tokens'>{spans_html(trace.spans)}</div>",
               untold_note(trace), charts.dynamics_figure(charts.dynamics_from_events(data["steps"], m)), step_rows(trace),
               list(save_trace_files(data)))

    yield from guarded(frames, lambda message: (status_html(message, "error"), *(gr.skip(),) * 6))


def build_server_tab() -> None:
    gr.Markdown("Run a prompt on a vLLM server started with `--speculative-config` and "
                "`--per-request-spec-decode-metrics detailed` (`make vllm` starts one here): its steps, as the server "
                "reports them. docs/vllm.md says how to point at any server.")
    with gr.Row():
        url = gr.Textbox(DEFAULT_URL, label="Server URL")
        model = gr.Textbox("", label="Model", placeholder="the server's only model")
        timeout = gr.Number(DEFAULT_TIMEOUT_S, label="Timeout (s)", minimum=1)
    spec = gr.Textbox("", label="The server's speculative config (JSON; needed to place an n-gram server's steps)")
    prompt = gr.Textbox(default_prompt(), label="Prompt", lines=3)
    with gr.Row():
        tokens = gr.Slider(1, 512, value=64, step=1, label="max new tokens")
        temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature")
        run = gr.Button("Run on the server", variant="primary")
    status = gr.HTML(status_html("Not run yet.", "info"))
    headline = gr.HTML()
    tokens_view = gr.HTML()
    note = gr.Markdown()
    dynamics = gr.Plot(charts.empty_figure("After a run: acceptance by position, drafts kept by draft length, each γ", 600),
                       label="Per-step dynamics (the server's steps are not timed)", elem_id="server-dynamics")
    table = gr.Dataframe(pd.DataFrame(columns=STEP_COLUMNS), label="Steps", interactive=False)
    files = gr.File(label="Trace file and HTML page", file_count="multiple")
    run.click(run_on_server, [url, model, spec, prompt, tokens, temperature, timeout],
              [status, headline, tokens_view, note, dynamics, table, files], concurrency_id="server",
              concurrency_limit=SERVER_CONCURRENCY, api_visibility="private")
