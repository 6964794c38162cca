"""A vLLM server as an engine, from answers captured from a real one (tests/fixtures/vllm/, replayed on loopback):
its per-request speculation split into steps, the trace it makes, and a one-line refusal of every answer that is not
what vLLM sends."""

import copy
import json
import socket

import pytest

import specviz
from specviz.api.server import server_trace
from specviz.api.trace import Trace, load_trace
from specviz.cli import main
from specviz.core.errors import ServerError
from specviz.models.vllm_steps import UNTOLD, ngram_proposal, split_steps
from specviz.runtime.config import DecodeConfig
from tests.vllm_replay import captured, replaying

FIXTURE_NAMES = ("draft-m", "ngram")


def run_of(name: str, run: str = "story") -> tuple[dict, dict]:
    data = captured(name)
    return data, data["runs"][run]


def chat_answer(run: dict) -> dict:
    return next(e["answer"] for e in run["exchanges"] if e["path"] == "/v1/chat/completions")


def trace_from(run: dict, url: str, **kw) -> Trace:
    return server_trace(run["prompt"], url, config=DecodeConfig(max_new_tokens=run["max_new_tokens"]), **kw)


def config_of(data: dict) -> dict:
    return {"speculative_config": data["speculative_config"]} if data.get("speculative_config") else {}


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("which", ["story", "stop"])
def test_a_captured_answer_splits_into_the_prefill_token_and_one_step_per_array_entry(name, which):
    data, run = run_of(name, which)
    answer = chat_answer(run)
    spec = answer["metrics"]["speculative_decoding"]
    with replaying(run["exchanges"]) as url:
        trace = trace_from(run, url, **config_of(data))
    ids = answer["choices"][0]["token_ids"]
    assert trace.token_ids == ids and trace.text == answer["choices"][0]["message"]["content"]
    first, steps = trace.steps[0], [s for s in trace.steps[1:] if s.draft_ids]
    assert first.emitted_ids == ids[:1] and first.draft_ids == [] and first.drafter == "target"
    assert sum(len(s.emitted_ids) for s in trace.steps) == len(ids)
    told = spec["per_step_accepted"] or []  # vLLM sends null for no step; its last may count drafts past the end
    assert [s.accepted for s in steps] == [min(a, len(s.emitted_ids)) for a, s in zip(told, steps, strict=True)]
    assert [s.accepted for s in steps[:-1]] == told[:-1]
    assert [len(s.draft_ids) for s in steps] == (spec["per_step_drafted"] or [])
    plain = [s for s in trace.steps[1:] if not s.draft_ids]
    assert all(len(s.emitted_ids) == 1 and s.drafter == "target" for s in plain)
    assert bool(plain) == (name == "ngram")  # vLLM lists no step an n-gram could not draft; specviz places them
    for s in steps:
        kept = s.emitted_ids[: s.accepted]
        assert s.draft_ids[: len(kept)] == kept and s.draft_p == s.draft_q == s.emitted_p == []
        if name == "ngram":  # the rule replayed names every draft
            assert None not in s.draft_ids and s.untold == ["p", "q", "times"]
        else:
            assert all(t is None for t in s.draft_ids[len(kept):]) and s.untold == UNTOLD
    m = trace.metrics
    assert (m["accepted"], m["drafted"], m["new_tokens"]) == (sum(s.accepted for s in steps), spec["num_draft_tokens"], len(ids))
    assert m["accepted"] <= spec["num_accepted_draft_tokens"]
    assert m["target_forwards"] == 1 + spec["num_spec_steps"] + len(plain)
    src = trace.source
    assert (src["engine"], src["version"], src["model"], src["url"]) == ("vllm", data["version"], data["model"], url)
    assert src["speculative_config"] == (data.get("speculative_config") or {"num_speculative_tokens": spec["num_spec_tokens"]})
    assert trace.config.gamma == spec["num_spec_tokens"] and trace.serving is None


def test_a_servers_trace_has_the_json_keys_of_a_local_run_and_saves_and_reloads(tmp_path):
    _, run = run_of("draft-m")
    with replaying(run["exchanges"]) as url:
        trace = trace_from(run, url)
    assert set(trace.to_json()) == set(Trace.JSON_KEYS)
    again = load_trace(trace.save(tmp_path / "server.json"))
    assert json.loads(json.dumps(again.to_dict())) == json.loads(json.dumps(trace.to_dict()))
    assert again.source == trace.source and again.steps[1].untold == UNTOLD
    unknown = [s for s in again.spans if s.kind in ("rejected", "unchecked")]
    assert len(unknown) == trace.metrics["drafted"] - trace.metrics["accepted"] and {s.text for s in unknown} == {"?"}
    assert "<html" in again.to_html().lower()


def test_the_api_and_the_cli_run_on_a_server(capsys, tmp_path):
    _, run = run_of("draft-m")
    with replaying(run["exchanges"]) as url:
        api = specviz.speculate(run["prompt"], server=url, max_new_tokens=run["max_new_tokens"])
        code = main(["generate", "--prompt", run["prompt"], "--server", url + "/v1", "--max-new-tokens",
                     str(run["max_new_tokens"]), "--json", "--trace-out", str(tmp_path / "t.json")])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["token_ids"] == api.token_ids == chat_answer(run)["choices"][0]["token_ids"]
    assert [s["accepted"] for s in printed["steps"]] == [s.accepted for s in api.steps]
    assert load_trace(tmp_path / "t.json").source["url"] == url


def mutated(change) -> callable:
    """A hook that hands the chat answer, deep-copied, to ``change`` and sends what it returns."""
    def hook(path, body, answer):
        return change(copy.deepcopy(answer)) if path == "/v1/chat/completions" else answer
    return hook


def spec_of(answer: dict) -> dict:
    return answer["metrics"]["speculative_decoding"]


def _set(answer: dict, **values) -> dict:
    spec_of(answer).update(values)
    return answer


def _bump_first_step(a: dict) -> dict:
    spec = spec_of(a)
    i = next(i for i, (acc, d) in enumerate(zip(spec["per_step_accepted"], spec["per_step_drafted"])) if acc < d)
    spec["per_step_accepted"][i] += 1
    spec["num_accepted_draft_tokens"] += 1
    return a


def _drop_summary_arrays(a: dict) -> dict:
    del spec_of(a)["per_step_accepted"], spec_of(a)["per_step_drafted"]
    return a


BAD_ANSWERS = [
    (lambda a: {**a, "metrics": None}, "no speculative-decoding metrics"),
    (lambda a: {**a, "metrics": {**a["metrics"], "speculative_decoding": None}}, "no speculative-decoding metrics"),
    (_drop_summary_arrays, "--per-request-spec-decode-metrics detailed"),
    (_bump_first_step, "cannot be drawn"),
    (lambda a: _set(a, num_accepted_draft_tokens=spec_of(a)["num_accepted_draft_tokens"] + 1), "do not add up to its totals"),
    (lambda a: _set(a, per_step_accepted=spec_of(a)["per_step_accepted"][:-1]), "disagree"),
    (lambda a: _set(a, per_step_accepted=[d + 1 for d in spec_of(a)["per_step_drafted"]]), "impossible"),
    (lambda a: _set(a, per_step_drafted=["3"] * len(spec_of(a)["per_step_drafted"])), "not a list of counts"),
    (lambda a: {**a, "choices": a["choices"] * 2}, "n = 1 only"),
    (lambda a: {**a, "choices": [{**a["choices"][0], "token_ids": None}]}, "return_token_ids"),
    (lambda a: {**a, "choices": [{**a["choices"][0], "token_ids": a["choices"][0]["token_ids"][:10]}]}, "cannot be drawn"),
    (lambda a: {**a, "choices": []}, "no choices"),
    (lambda a: json.dumps(a).encode()[: len(json.dumps(a)) // 2], "did not answer with JSON"),
    (lambda a: b"<html>Bad Gateway</html>", "did not answer with JSON"),
    (lambda a: [1, 2], "JSON object"),
    (lambda a: (500, b'{"error": {"message": "engine dead\\nmore"}}'), "HTTP 500: engine dead"),
]


@pytest.mark.parametrize("change, fragment", BAD_ANSWERS)
def test_an_answer_that_is_not_what_vllm_sends_is_refused_in_one_line(change, fragment):
    _, run = run_of("draft-m")
    with replaying(run["exchanges"], mutated(change)) as url, pytest.raises(ServerError) as err:
        trace_from(run, url)
    message = str(err.value)
    assert fragment in message and "\n" not in message


def test_the_n2_answer_vllm_gave_is_refused():
    data, run = run_of("draft-m")
    with replaying(run["exchanges"], mutated(lambda a: data["refused"]["n2"])) as url, pytest.raises(ServerError, match="n = 1"):
        trace_from(run, url)


def test_a_model_the_server_does_not_serve_is_named_with_the_ones_it_does():
    data, run = run_of("draft-m")
    with replaying(run["exchanges"]) as url, pytest.raises(ServerError) as err:
        trace_from(run, url, model="no-such-model")
    assert "'no-such-model'" in str(err.value) and data["model"] in str(err.value)
    assert "no-such-model" in data["refused"]["unknown_model_error"]  # vLLM itself refuses it too


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("route, fragment", [("/version", "not vLLM's"), ("/v1/models", "not an OpenAI-compatible API")])
def test_a_server_without_vllms_routes_is_not_vllm(route, fragment):
    _, run = run_of("draft-m")
    hook = lambda path, body, answer: (404, b'{"detail":"Not Found"}') if path == route else answer  # noqa: E731
    with replaying(run["exchanges"], hook) as url, pytest.raises(ServerError, match=fragment):
        trace_from(run, url)


def test_a_url_that_does_not_answer_and_a_server_that_is_too_slow():
    _, run = run_of("draft-m")
    with pytest.raises(ServerError, match="no server answers"):
        trace_from(run, f"http://127.0.0.1:{closed_port()}")
    with replaying(run["exchanges"], delay_s=1.0) as url, pytest.raises(ServerError, match="did not answer within 0.2 s"):
        trace_from(run, url, timeout=0.2)
    with pytest.raises(ServerError, match="http"):
        trace_from(run, "ftp://127.0.0.1")


@pytest.mark.parametrize("args, fragment", [
    (["--model", "x"], "--model describes a server"),
    (["--server", "URL", "--draft", "draft-m"], "--draft is for local runs"),
    (["--server", "URL", "--no-chat"], "--chat cannot be turned off"),
    (["--server", "CLOSED"], "no server answers"),
    (["--server", "URL", "--model", "nope"], "does not serve model 'nope'"),
])
def test_cli_mistakes_with_a_server_exit_2_with_one_line(capsys, args, fragment):
    _, run = run_of("draft-m")
    with replaying(run["exchanges"]) as url:
        args = [{"URL": url, "CLOSED": f"http://127.0.0.1:{closed_port()}"}.get(x, x) for x in args]
        code = main(["generate", "--prompt", run["prompt"], *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("specviz: error:") and fragment in err[0], err


def test_tokens_the_arrays_do_not_cover_are_refused_unless_the_ngram_rule_places_them():
    with pytest.raises(ServerError, match="give its speculative config"):
        split_steps([], list(range(8)), [1, 1], [3, 3], {})
    with pytest.raises(ServerError, match="tokens end after 1"):
        split_steps([], list(range(3)), [1, 1], [3, 3], {})
    steps = split_steps([], list(range(6)), [3, 3], [3, 3], {})  # the last step cut short by a stop token
    assert [s.emitted_ids for s in steps] == [[0], [1, 2, 3, 4], [5]]


def test_a_last_step_that_accepted_drafts_past_the_end_keeps_those_it_emitted():
    """At max_tokens vLLM still drafts γ and counts every draft it accepted: prompt [1 2], output 5 6 7 with max_tokens 3;
    the step after the prefill token accepted 3 of 3 drafts but only 6 7 were emitted."""
    steps = split_steps([1, 2], [5, 6, 7], [3], [3], {})
    assert [(s.draft_ids, s.accepted, s.emitted_ids) for s in steps] == [([], 0, [5]), ([6, 7, None], 2, [6, 7])]
    assert steps[1].accept_reasons == ["exact", "exact"]


def test_the_ngram_rule_is_vllms_longest_then_earliest_match():
    assert ngram_proposal([5, 6, 7, 5, 6, 8, 5, 6], 1, 3, 3) == [7, 5, 6]  # "5 6" twice before: the earliest wins
    assert ngram_proposal([1, 2, 3, 9, 2, 3, 4, 2, 3], 1, 3, 2) == [9, 2]  # "4 2 3" never came before; "2 3" twice
    assert ngram_proposal([1, 2, 3, 4], 1, 3, 3) == []
    assert ngram_proposal([4, 1, 2, 9, 2], 2, 3, 3) == []  # only a 1-token match: under the shortest allowed
    # prompt [1 2], output 1 2 1 2 1: steps after the prefill token, replayed with k = 2
    steps = split_steps([1, 2], [1, 2, 1, 2, 1], [2, 0], [2, 2], {}, ngram=(1, 3, 2))
    assert [(s.draft_ids, s.emitted_ids) for s in steps] == [([], [1]), ([2, 1], [2, 1, 2]), ([1, 2], [1])]
    with pytest.raises(ServerError, match="does not reproduce"):
        split_steps([1, 2], [1, 2, 1, 2, 1], [2, 0], [3, 2], {}, ngram=(1, 3, 2))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_a_streamed_answer_gives_the_same_trace_and_reports_its_progress(name):
    """The app's request streams: the answer so far after each chunk, and the steps from the final usage chunk, the same
    as the whole answer's."""
    data, whole = run_of(name)
    _, streamed = run_of(name, "story-streamed")
    seen: list[tuple[int, str]] = []
    with replaying(streamed["exchanges"]) as url:
        trace = trace_from(streamed, url, **config_of(data), progress=lambda ids, text: seen.append((len(ids), text)))
    with replaying(whole["exchanges"]) as url:
        reference = trace_from(whole, url, **config_of(data))
    assert trace.token_ids == reference.token_ids and trace.text == reference.text
    def timeless(steps):
        return [{k: v for k, v in s.to_dict().items() if k != "elapsed_ms"} for s in steps]
    assert timeless(trace.steps) == timeless(reference.steps)  # the server's own times differ from request to request
    counts = [n for n, _ in seen]
    assert counts == sorted(counts) and counts[-1] == len(trace.token_ids) and len(seen) > 1
    assert seen[-1][1] == trace.text and all(trace.text.startswith(text) for _, text in seen)


def streamed_bytes(change) -> callable:
    """A hook that hands the streamed answer's chunks (deep-copied, [DONE] left off) to ``change`` and sends the bytes
    it returns."""
    def hook(path, body, answer):
        if path != "/v1/chat/completions":
            return answer
        chunks = [json.loads(line[len(b"data: "):]) for line in answer.split(b"\n\n") if line.startswith(b"data: {")]
        return change(copy.deepcopy(chunks))
    return hook


def sse(chunks: list, done: bool = True) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (b"data: [DONE]\n\n" if done else b"")


BAD_STREAMS = [
    (lambda c: sse(c, done=False), "ended before its final [DONE]"),
    (lambda c: sse(c[:-1]), "no speculative-decoding metrics"),
    (lambda c: sse(c[:3], done=False) + b"data: {not json\n\n", "streamed a chunk that is not JSON"),
    (lambda c: sse(c[:3] + [{"error": {"message": "engine dead\nmore"}}]), "failed while streaming: engine dead"),
    (lambda c: sse(c[:2] + [{**c[2], "choices": [{**c[2]["choices"][0], "index": 1}]}] + c[3:]), "n = 1 only"),
    (lambda c: sse(c[:2] + [{**c[2], "choices": [{**c[2]["choices"][0], "token_ids": "12"}]}] + c[3:]), "not as vLLM streams"),
    (lambda c: sse([{**x, "choices": None} if i == 2 else x for i, x in enumerate(c)]), "has no choices"),
    (lambda c: sse(c[:2] + c[3:]), "cannot be drawn"),  # a chunk lost: the ids no longer add up to the arrays
]


@pytest.mark.parametrize("change, fragment", BAD_STREAMS)
def test_a_stream_that_is_not_what_vllm_sends_is_refused_in_one_line(change, fragment):
    data, run = run_of("draft-m", "story-streamed")
    with replaying(run["exchanges"], streamed_bytes(change)) as url, pytest.raises(ServerError) as err:
        trace_from(run, url, progress=lambda ids, text: None)
    message = str(err.value)
    assert fragment in message and "\n" not in message
