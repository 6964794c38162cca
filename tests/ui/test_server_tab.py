"""The Server tab's handler against answers captured from a real vLLM (replayed on loopback): the run's views, and a
visible one-line error for each failure, with the handler still serving after it."""

import json

import pandas as pd

from specviz.ui.server import run_on_server
from specviz.viz.trace import STEP_COLUMNS
from tests.vllm_replay import captured, replaying


def frames(url: str, run: dict, spec: str = "", model: str = "", timeout: float = 30.0) -> list[tuple]:
    return list(run_on_server(url, model, spec, run["prompt"], run["max_new_tokens"], 0.0, timeout))


def test_a_server_run_draws_tokens_steps_and_what_the_server_does_not_tell():
    data = captured("ngram")
    run = data["runs"]["story-streamed"]  # the tab streams the answer
    with replaying(run["exchanges"]) as url:
        out = frames(url, run, json.dumps(data["speculative_config"]))
    assert len(out) >= 3 and "Waiting for" in out[0][0]
    progress = [frame for frame in out[1:-1]]  # the answer so far while it streams, at most every 0.15 s
    assert progress and all("Receiving from" in frame[0] and "sv-streaming" in frame[2] for frame in progress)
    status, headline, tokens, note, dynamics, table, files = out[-1]
    assert "drafts accepted" in status and "sv-tokens" in tokens and headline
    panels = {t.name for t in dynamics.data}  # the server's run, like a local one: acceptance by position, by length, each γ
    assert {"P(accept | drafted)", "tokens per step at γ"} <= panels and any(name.startswith("drafted ") for name in panels)
    assert "predicted speedup at γ" not in panels  # its steps are not timed
    assert "does not tell the target's p, the draft's q, the step's time" in note and data["version"] in note
    assert isinstance(table, pd.DataFrame) and list(table.columns) == STEP_COLUMNS and len(table) > 1
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "html"]


def test_failures_are_one_visible_line_and_the_tab_keeps_serving():
    data = captured("ngram")
    run = data["runs"]["story-streamed"]  # the tab streams the answer
    with replaying(run["exchanges"]) as url:
        errors = [frames(url, run)[-1][0],  # the n-gram steps cannot be placed without the server's config
                  frames(url, run, "{not json")[-1][0],
                  frames(url, run, model="nope")[-1][0],
                  frames(url + "/nothing-here", run)[-1][0]]
        ok = frames(url, run, json.dumps(data["speculative_config"]))[-1][0]
    assert all("sv-status-error" in e for e in errors), errors
    for error, fragment in zip(errors, ["give its speculative config", "not JSON", "does not serve model", "not an OpenAI-compatible API"]):
        assert fragment in error, error
    assert "drafts accepted" in ok
