"""Every user mistake on the CLI: one line on stderr, non-zero exit, no traceback."""

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.getcwd()}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True, env=ENV, timeout=300)


def assert_one_line_error(r: subprocess.CompletedProcess, fragment: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("specviz: error:")]
    assert len(lines) == 1 and fragment in lines[0], r.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--max-new-tokens", "-5"], "--max-new-tokens"),
    (["--max-new-tokens", "100000000"], "--max-new-tokens"),
    (["--gamma", "0"], "--gamma"),
    (["--gamma", "99"], "--gamma"),
    (["--temperature", "-0.1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--method", "beam"], "--method"),
    (["--preset", "no-such-preset"], "unknown preset"),
    (["--draft", "no-such-draft"], "unknown draft"),
    (["--gamma", "three"], "invalid int value"),
    (["--accept", "bogus"], "--accept"),
    (["--gamma-policy", "bogus"], "--gamma-policy"),
    (["--judge-threshold", "1.5"], "--judge-threshold"),
    (["--lenience", "0"], "--lenience"),
    (["--topk", "0"], "--topk"),
    (["--chain", "draft-s"], "--chain needs at least two"),
    (["--chain", "draft-s,draft-s"], "--chain needs at least two"),
    (["--chain", "draft-s,ngram"], "n-gram drafter can only be the first"),
    (["--chain", "ngram,draft-s", "--draft", "draft-m"], "--chain replaces the draft"),
    (["--chain", "ngram,draft-s", "--level-gamma", "0"], "--level-gamma"),
    (["--chain", "ngram,no-such-draft"], "unknown draft"),
    (["--chain", "head,draft-s"], "feature head"),
    (["--dtype", "float16"], "--dtype"),
    (["--select", "ngram,draft-s", "--method", "ar"], "--select chooses the draft per step: use it with --method sd"),
    (["--gamma", "11"], "--gamma must be between 1 and 10"),
])
def test_bad_options(args, fragment):
    assert_one_line_error(cli("generate", "--prompt", "hi", *args), fragment)


def test_missing_prompt():
    assert_one_line_error(cli("generate"), "--prompt")


def test_unreadable_prompt_file(tmp_path):
    assert_one_line_error(cli("generate", "--prompt-file", str(tmp_path / "missing.txt")), "--prompt-file")


@pytest.mark.parametrize("args", [["--prompts", "0"], ["--gamma", "40"], ["--top", "0"]])
def test_chain_advisor_bad_options(args):
    assert_one_line_error(cli("chain-advisor", *args), "chain-advisor needs")


def test_judge_commands_report_missing_files(tmp_path):
    assert_one_line_error(cli("judge", "train", "--features", str(tmp_path / "none.pt")), "none.pt")
    assert_one_line_error(cli("judge", "build", "--dataset", str(tmp_path / "none.jsonl")), "none.jsonl")


def test_unknown_command():
    assert_one_line_error(cli("fly"), "invalid choice")


@pytest.mark.slow
def test_empty_prompt():
    assert_one_line_error(cli("generate", "--prompt", "   "), "prompt is empty")


@pytest.mark.slow
def test_prompt_longer_than_context(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("word " * 9000)
    assert_one_line_error(cli("generate", "--prompt-file", str(f), "--no-chat"), "exceeds the target's context")


@pytest.mark.slow
def test_a_bad_thread_count_in_the_environment():
    r = subprocess.run([sys.executable, "-m", "specviz", "generate", "--prompt", "hi", "--max-new-tokens", "2"], capture_output=True,
                       text=True, env={**ENV, "SPECVIZ_TORCH_THREADS": "many"}, timeout=300)
    assert_one_line_error(r, "SPECVIZ_TORCH_THREADS is 'many'")


@pytest.mark.slow
def test_unloadable_hub_draft_offline():
    assert_one_line_error(cli("generate", "--prompt", "hi", "--draft", "nobody/no-such-model"), "cannot load model")


@pytest.mark.slow
def test_json_contract():
    r = cli("generate", "--prompt", "Name three colors.", "--draft", "ngram", "--gamma", "3", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "token_ids", "config", "metrics", "steps", "theory"}
    m = out["metrics"]
    assert set(m) >= {"new_tokens", "wall_s", "tokens_per_s", "target_forwards", "mean_accept_len", "accept_rate"}
    assert m["new_tokens"] == len(out["token_ids"]) <= 12
    assert m["mean_accept_len"] == pytest.approx(m["new_tokens"] / m["target_forwards"])
    step_keys = {"step", "drafter", "gamma", "drafted", "draft_ids", "accepted", "emitted_ids", "accept_reasons", "judge_scores",
                 "spans", "total_ms", "why"}
    assert all(set(s) >= step_keys for s in out["steps"])
    assert all(sum(s["spans"].values()) == pytest.approx(s["total_ms"], rel=0.02) for s in out["steps"])
    assert [t for s in out["steps"] for t in s["emitted_ids"]] == out["token_ids"]
    assert out["config"]["dtype"] == "auto"


@pytest.mark.slow
def test_full_draft_vocab_changes_the_drafts_cost_not_the_greedy_text():
    runs = [cli("generate", "--prompt", "Write a haiku about rain.", "--draft", "draft-m", "--max-new-tokens", "24", "--json", *flag)
            for flag in ([], ["--full-draft-vocab"])]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    outs = [json.loads(r.stdout) for r in runs]
    assert [o["config"]["full_draft_vocab"] for o in outs] == [False, True]
    assert outs[0]["token_ids"] == outs[1]["token_ids"]


@pytest.mark.slow
def test_chain_json_has_theory():
    r = cli("generate", "--prompt", "Name three colors.", "--chain", "ngram,draft-s", "--gamma", "4", "--level-gamma", "2",
            "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    theory = json.loads(r.stdout)["theory"]
    assert [lv["name"] for lv in theory["levels"]] == ["target", "draft-s", "ngram"]
    assert all(lv["T_ms"] >= 0 for lv in theory["levels"]) and theory["levels"][1]["L"] >= 1
    assert theory["predicted_tokens_per_s"] > 0 and theory["measured_tokens_per_s"] > 0
    assert theory["insertions"][0]["inserted"] == "draft-s" and theory["insertions"][0]["L_i_break_even"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["judge", "lenient", "topk"])
def test_relaxed_rules_report_reasons(rule):
    r = cli("generate", "--prompt", "What is 12 + 30?", "--draft", "draft-s", "--accept", rule, "--lenience", "0.3",
            "--topk", "20", "--judge-threshold", "0.5", "--max-new-tokens", "16", "--json")
    assert r.returncode == 0, r.stderr
    steps = json.loads(r.stdout)["steps"]
    reasons = {x for s in steps for x in s["accept_reasons"]}
    assert reasons <= {"exact", rule, "rejected", "unchecked"}
    assert all((s["judge_scores"] is not None) == (rule == "judge" and bool(s["draft_ids"])) for s in steps)


@pytest.mark.parametrize("args, fragment", [
    (["--configs", "nope"], "--configs must be one of"),
    (["--configs", "judge", "--only", "exact,judge δ=0.3"], "no row 'judge δ=0.3'"),
    (["--repeats", "0"], "--repeats must be at least 1"),
])
def test_bench_bad_options(args, fragment):
    assert_one_line_error(cli("bench", *args), fragment)
