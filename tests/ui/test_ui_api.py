"""The app through its API (gradio_client against a launched server): streaming, errors, comparison and
exports, the theory endpoint, and two sessions at once."""

import csv
import html
import json
import re
import threading

import pytest

import specviz

SHORT = 16
"""New tokens of the API tests' generations."""

pytestmark = pytest.mark.slow

PROMPT_A = "Write a python function that adds two numbers."
PROMPT_B = "Name three colours of the rainbow."
CONFIG_HEADERS = ["label", "method", "draft", "γ", "γ policy", "accept"]
"""A subset of the table's columns, by label or setting name: the other settings take their defaults."""


def explore(client, prompt, **kw):
    args = {"prompt": prompt, "draft": "ngram", "max_new_tokens": SHORT, **kw}
    job = client.submit(api_name="/explore_run", **args)
    frames = list(job)
    return frames, job.result()


def visible_text(tokens_html: str) -> str:
    """The generated text as shown: every span but the rejected / unchecked drafts, unescaped."""
    kept = re.findall(r'data-kind="(?!rejected|unchecked)[a-z]+" title="[^"]*">(.*?)</span>(?=<span class="sv-tok|$)', tokens_html)
    return html.unescape("".join(re.sub(r'<span class="sv-nl">.</span>', "", k) for k in kept))


def test_explore_streams_steps_then_races_against_ar(client):
    frames, final = explore(client, PROMPT_A)
    status, headline, tokens, race, dynamics, table = final[:6]
    assert "Done (run #" in status and "AR measured after the run" in status
    streaming = [f for f in frames if "Decoding" in str(f[0]) and 'class="sv-tok' in str(f[2])]
    assert streaming, "token spans must appear while the run is still going"
    assert "speedup vs AR" in headline and "×" in headline
    assert len(table["data"]) >= 1 and table["headers"][0] == "step"
    assert sum(row[5] for row in table["data"]) == SHORT
    names = [t["name"] for t in json.loads(race["plot"])["data"]]
    assert len(names) == 3 and any("AR" in n for n in names) and names[-1].startswith("transformers' generate")
    assert "Output identical to the AR baseline: yes" in status  # greedy + exact acceptance is lossless
    # transformers' generate, timed beside the AR baseline on its stock kernels: its speedup card, from the saved numbers
    trace = specviz.load_trace(final[9])
    generate = trace.transformers
    assert generate["new_tokens"] == SHORT and isinstance(generate["same_tokens_as_ar"], bool)
    assert f"{trace.metrics['tokens_per_s'] / generate['tokens_per_s']:.2f}×" in headline
    assert "speedup vs transformers&#x27; generate" in headline and f"generate {generate['tokens_per_s']:.1f} tok/s" in headline
    assert "stock nn.Linear kernels" in status and "linear kernels by rows: 1 " in status


def test_errors_are_visible_and_the_app_keeps_serving(client):
    cases = [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "hi", "draft": "nobody/no-such-model"}, "cannot load model"),
        ({"prompt": "hi", "seed": -1}, "“seed” must be between"),
        ({"prompt": "hi", "preset": "smollm2"}, "cannot load"),  # a hub preset while offline
    ]
    for args, message in cases:
        _, final = explore(client, **{"max_new_tokens": SHORT, **args})
        assert "sv-status-error" in final[0] and message in final[0], (args, final[0])
    for args, message in [({"gamma": 1000}, "greater than maximum"), ({"max_new_tokens": 100000}, "greater than maximum"),
                          ({"preset": "no-such-preset"}, "not in the list of choices")]:
        with pytest.raises(Exception, match=message):  # gradio's own bounds check on the sliders, shown as an error toast
            explore(client, "hi", **args)
    _, final = explore(client, PROMPT_B, max_new_tokens=4, baseline="skip")
    assert "Done" in final[0] and "AR baseline skipped" in final[0]


def test_compare_two_configs_with_exports(client):
    table = {"headers": CONFIG_HEADERS, "data": [["ngram γ=2", "sd", "ngram", 2, "fixed", "exact"],
                                                 ["ngram γ=6", "sd", "ngram", 6, "fixed", "exact"]]}
    status, columns, race, metrics, replay, csv_path, json_path, column, traces = client.predict(
        prompt=PROMPT_A, configs=table, max_new_tokens=8, api_name="/compare_run")
    generate = "transformers' generate (stock kernels)"
    assert f"Run order: autoregressive (AR baseline)#1 → {generate}#1 → ngram γ=2#1 → ngram γ=6#1" in html.unescape(status)
    assert columns.count('class="sv-col"') == 4
    assert [r[0] for r in metrics["data"]] == ["autoregressive (AR baseline)", generate, "ngram γ=2", "ngram γ=6"]
    speedups = dict(zip((r[0] for r in metrics["data"]), (r[metrics["headers"].index("speedup vs transformers generate")]
                                                          for r in metrics["data"])))
    assert speedups[generate] == 1.0 and all(v > 0 for v in speedups.values())
    assert len(json.loads(race["plot"])["data"]) == 4
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert {r["config"] for r in rows} == {"autoregressive (AR baseline)", "ngram γ=2", "ngram γ=6"}
    with open(json_path) as f:
        data = json.load(f)
    assert data["order"] == ["autoregressive (AR baseline)#1", f"{generate}#1", "ngram γ=2#1", "ngram γ=6#1"] and len(data["runs"]) == 4
    assert all(run["events"] for run in data["runs"] if run["label"] != generate)  # generate has no steps, only its total
    columns_traces = [specviz.load_trace(path) for path in traces]  # each column with steps as a trace file, with generate
    assert len(traces) == 3 and all(t.steps and t.transformers["tokens_per_s"] > 0 for t in columns_traces)
    replayed = client.predict(at_s=0.0, api_name="/compare_replay")
    assert replayed.count('class="sv-col"') == 4 and "0 tokens at 0.00 s" in replayed


def test_a_failing_transformers_generate_is_a_visible_message_and_the_run_stands(client, monkeypatch):
    from specviz.ui import handlers

    def fails(config, prompt):
        raise RuntimeError("generate broke")

    monkeypatch.setattr(handlers, "generate_timing", fails)  # the app serves from this process
    _, final = explore(client, "Count to five.", max_new_tokens=6)
    assert "sv-status-warn" in final[0] and "Done (run #1)" in final[0] and "generate broke" in final[0]
    assert "not measured: unexpected error (RuntimeError): generate broke" in final[1] and "speedup vs AR" in final[1]
    table = {"headers": CONFIG_HEADERS, "data": [["ngram γ=2", "sd", "ngram", 2, "fixed", "exact"]]}
    status, columns, _, metrics, *_ = client.predict(prompt=PROMPT_A, configs=table, max_new_tokens=4, api_name="/compare_run")
    assert "sv-status-warn" in status and "generate broke" in status and "failed: unexpected error" in columns
    assert [r[0] for r in metrics["data"]] == ["autoregressive (AR baseline)", "ngram γ=2"]


def test_compare_rejects_bad_rows_visibly(client):
    table = {"headers": CONFIG_HEADERS, "data": [["a", "sd", "ngram", 2, "fixed", "exact"],
                                                 ["b", "sd", "ngram", 99, "fixed", "exact"]]}
    status = client.predict(prompt=PROMPT_A, configs=table, max_new_tokens=8, api_name="/compare_run")[0]
    assert "sv-status-error" in status and "configuration row 2 (b)" in status and "“γ” must be between" in status


def test_explain_endpoint(client):
    plot, numbers, theory, lengths = client.predict(alpha=0.8, c=0.05, gamma_max=10, api_name="/explain")
    assert "best γ* =" in numbers and len(json.loads(plot["plot"])["data"]) >= 4
    assert "Lemma 3.1" in theory and lengths is not None


def test_two_sessions_never_see_each_others_runs(app_url):
    from gradio_client import Client

    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    results = {}

    def go(name, client, prompt):
        results[name] = explore(client, prompt, baseline="skip")

    threads = [threading.Thread(target=go, args=("a", a, PROMPT_A)), threading.Thread(target=go, args=("b", b, PROMPT_B))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    text_a, text_b = (visible_text(results[k][1][2]) for k in "ab")
    assert text_a and text_b and text_a != text_b
    for name, text in (("a", text_a), ("b", text_b)):  # every streamed frame shows only that session's own tokens
        for frame in results[name][0]:
            if 'class="sv-tok' in str(frame[2]):
                assert text.startswith(visible_text(frame[2]))
    solo = Client(app_url, verbose=False)
    assert visible_text(explore(solo, PROMPT_A, baseline="skip")[1][2]) == text_a  # greedy: the same as a run alone
    # Per-session state: a's next run is its #2 and reuses nothing b measured; b's counter is its own.
    _, final_b = explore(b, PROMPT_A, max_new_tokens=4, baseline="skip")
    assert "(run #2)" in final_b[0]


def test_ar_baseline_modes_and_session_cache(client):
    prompt = "List three fruits."
    _, ar = explore(client, prompt, method="ar", max_new_tokens=6)
    assert "this run is the ar baseline" in ar[0].lower() and "1.00×" in ar[1]
    _, sd = explore(client, prompt, max_new_tokens=6)
    assert "reused" in sd[0]  # measured by the AR run above, in this session
    frames, before = explore(client, "List three vegetables.", max_new_tokens=6, baseline="before the run")
    assert "AR measured before the run" in before[0]
    assert any("Measuring the AR baseline first" in str(f[0]) for f in frames)


def test_generate_endpoint_returns_the_cli_json_and_one_line_errors(client):
    result = client.predict(PROMPT_A, {"draft": "ngram", "gamma": 2, "max_new_tokens": 6}, api_name="/generate")
    assert set(result) == {"text", "token_ids", "config", "metrics", "steps", "theory"} and result["config"]["gamma"] == 2
    for settings, message in [({"gamma": 0}, "gamma= must be between"), ({"colour": 1}, "unknown setting 'colour'"),
                              ({"max_new_tokens": 1000}, "at most 512"), ({"draft": "nobody/nothing"}, "cannot load model")]:
        with pytest.raises(Exception, match=message):
            client.predict(PROMPT_A, settings, api_name="/generate")
    assert client.predict(PROMPT_A, {"max_new_tokens": 2}, api_name="/generate")["metrics"]["new_tokens"] == 2  # still serving


def test_compare_holds_a_vllm_server_column_beside_local_ones(client):
    """A server (a replay of what the real vLLM answered, streamed) as a column in the same rounds: its tokens equal the
    local AR's (greedy, the same target), its steps step through, its row has the step metrics; a bad server config is a
    visible error."""
    from tests.vllm_replay import captured, replaying

    run = captured("draft-m")["runs"]["story-streamed"]
    table = {"headers": CONFIG_HEADERS, "data": [["ngram γ=2", "sd", "ngram", 2, "fixed", "exact"]]}
    with replaying(run["exchanges"]) as url:
        status, columns, race, metrics, replay, csv_path, json_path, column, traces = client.predict(
            prompt=run["prompt"], configs=table, max_new_tokens=run["max_new_tokens"], transformers=False, server_url=url,
            api_name="/compare_run")
    assert "sv-status-ok" in status and "vLLM server#1" in html.unescape(status), status
    assert columns.count('class="sv-col"') == 3 and "the server&#x27;s speculation at" in columns
    headers, rows = metrics["headers"], {r[0]: r for r in metrics["data"]}
    server = rows["vLLM server"]
    assert server[headers.index("same tokens as AR")] == "yes" and server[headers.index("accept rate")] > 0
    assert "vLLM server" in {t["name"] for t in json.loads(race["plot"])["data"]}
    with open(json_path) as f:
        runs = {r["label"]: r for r in json.load(f)["runs"]}
    assert runs["vLLM server"]["events"][0]["untold"] and len(traces) == 3  # a trace per column with steps
    bad = client.predict(prompt=run["prompt"], configs=table, max_new_tokens=8, transformers=False, server_url="http://127.0.0.1:1",
                         server_spec="{nope", api_name="/compare_run")[0]
    assert "sv-status-error" in bad and "speculative config is not JSON" in bad
