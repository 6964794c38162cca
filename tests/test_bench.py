"""The benchmark's tables, suites and configuration sets on hand-made rows, and its transformers peer on tiny models."""

import csv
import json
import math
import threading

import pytest

from specviz.bench.configs import CONFIG_SETS, BenchConfig, head_configs
from specviz.bench.harness import fastest_runs, hf_generate, rotations
from specviz.bench.report import markdown, peer_table, summary_table, theory_columns, write_results
from specviz.runtime.config import DecodeConfig
from tests.conftest import tiny_llama
from tests.test_engine import PROMPTS, reference

NAN = float("nan")


def bench_row(config, prompt_id, tokens_per_s, speedup, accept_len=NAN, accept_rate=NAN, same=True, ms=(0.0, 0.0, 0.0),
              overhead_frac=NAN, positions=(), category="chat"):
    """One row as ``run_benchmark`` writes it (hf-assisted rows have NaN acceptance and zero phase timers)."""
    return {"prompt_id": prompt_id, "category": category, "config": config, "new_tokens": 32, "wall_s": 1.0,
            "tokens_per_s": tokens_per_s, "speedup": speedup, "mean_accept_len": accept_len, "accept_rate": accept_rate,
            "same_tokens_as_ar": same, "draft_ms": ms[0], "verify_ms": ms[1], "overhead_ms": ms[2],
            "engine_overhead_frac": overhead_frac, "per_position_accept": json.dumps(list(positions)),
            **theory_columns(None), "target_logprob": NAN, "correct": ""}


ROWS = [
    bench_row("ar", "p1", 10.0, 1.0, 1.0, 0.0, ms=(0, 90, 10), overhead_frac=0.1),
    bench_row("ar", "p2", 20.0, 1.0, 1.0, 0.0, ms=(0, 180, 20), overhead_frac=0.1),
    bench_row("ar", "p3", 30.0, 1.0, 1.0, 0.0, ms=(0, 270, 30), overhead_frac=0.1, category="math"),
    bench_row("sd", "p1", 15.0, 1.5, 3.0, 0.5, ms=(20, 60, 20), overhead_frac=0.2, positions=[0.8, 0.6, 0.4]),
    bench_row("sd", "p2", 50.0, 2.5, 4.0, 0.75, same=False, ms=(30, 60, 10), overhead_frac=0.3, positions=[1.0]),
    bench_row("sd", "p3", 36.0, 1.2, 2.0, 0.25, ms=(10, 30, 10), overhead_frac=0.1, positions=[0.6, 0.2], category="math"),
    bench_row("hf", "p1", 12.0, 1.2),
    bench_row("hf", "p2", 22.0, 1.1, same=False),
    bench_row("hf", "p3", 40.0, 4 / 3, category="math"),
]


def test_summary_table_aggregates_each_configuration_by_hand():
    ar, sd, hf = summary_table(ROWS, ["ar", "sd", "hf"])
    assert [r["config"] for r in (ar, sd, hf)] == ["ar", "sd", "hf"]
    assert sd["tok/s (median)"] == 36.0 and sd["speedup vs ar (median)"] == 1.5
    assert sd["tok/s (total)"] == pytest.approx(3 * 32 / 3.0)  # every prompt's tokens over every prompt's wall time
    assert sd["mean accepted len"] == pytest.approx(3.0) and sd["accept rate"] == pytest.approx(0.5)
    # position i averages the runs that drafted that deep: (0.8 + 1.0 + 0.6) / 3, (0.6 + 0.2) / 2, 0.4 / 1
    assert sd["per-position accept"] == "0.80 0.40 0.40"
    assert sd["draft/verify/other %"] == "24/60/16"  # of 250 ms: 60 / 150 / 40
    assert sd["engine overhead %"] == pytest.approx(20.0)
    assert sd["same tokens as AR"] == "2/3"
    assert ar["draft/verify/other %"] == "0/90/10" and ar["accept rate"] == 0.0 and ar["per-position accept"] == ""
    assert ar["same tokens as AR"] == "3/3"


def test_summary_table_of_untimed_rows_without_acceptance():
    (hf,) = summary_table(ROWS, ["hf"])
    assert hf["speedup vs hf (median)"] == pytest.approx(1.2)  # the first label is the reference column's name
    assert math.isnan(hf["mean accepted len"]) and math.isnan(hf["accept rate"])  # NaN rows are skipped, not averaged
    assert hf["draft/verify/other %"] == "n/a" and math.isnan(hf["engine overhead %"])
    assert hf["same tokens as AR"] == "2/3"


def test_the_total_rate_weighs_each_prompt_by_its_time_where_the_median_does_not():
    rows = [{**bench_row("x", f"p{i}", 32 / wall, 1.0), "wall_s": wall} for i, wall in enumerate((1.0, 1.0, 6.0))]
    (x,) = summary_table(rows, ["x"])
    assert x["tok/s (median)"] == pytest.approx(32.0)
    assert x["tok/s (total)"] == pytest.approx(96 / 8.0)  # the slow prompt's 6 s count in full


def test_summary_table_skips_only_the_nan_rows_when_averaging_acceptance():
    rows = [bench_row("x", "p1", 10.0, 1.0, 2.0, 0.4, ms=(1, 1, 1)), bench_row("x", "p2", 10.0, 1.0, ms=(1, 1, 1)),
            bench_row("x", "p3", 10.0, 1.0, 4.0, 0.6, ms=(1, 1, 1))]
    (x,) = summary_table(rows, ["x"])
    assert x["mean accepted len"] == pytest.approx(3.0) and x["accept rate"] == pytest.approx(0.5)


def test_markdown_renders_a_pipe_table():
    text = markdown([{"config": "ar", "tok/s": 10.0, "n": 3, "ok": True}, {"config": "sd", "tok/s": 12.3456, "n": 4, "ok": False}])
    assert text.splitlines() == ["| config | tok/s | n | ok |", "|---|---|---|---|", "| ar | 10.00 | 3 | True |",
                                 "| sd | 12.35 | 4 | False |"]


def test_markdown_of_a_summary_table_has_one_line_per_configuration():
    lines = markdown(summary_table(ROWS, ["ar", "sd", "hf"])).splitlines()
    assert len(lines) == 2 + 3
    assert all(line.count("|") == 11 for line in lines)  # ten columns
    assert lines[3].startswith("| sd | 36.00 | 32.00 | 1.50 | 3.00 | 0.50 | 0.80 0.40 0.40 | 24/60/16 | 20.00 | 2/3 |")
    assert "| nan |" in lines[4] and "| n/a |" in lines[4]


@pytest.mark.parametrize("name", sorted(CONFIG_SETS))
def test_config_sets_have_unique_labels_and_valid_configs(name):
    configs = CONFIG_SETS[name](48)
    labels = [c.label for c in configs]
    assert len(set(labels)) == len(labels)
    for c in configs:
        c.decode.validate()
        assert c.decode.max_new_tokens == 48


@pytest.mark.parametrize("name", sorted(set(CONFIG_SETS) - {"judge", "judge-head"}))
def test_config_sets_put_ar_first_and_only_once(name):
    configs = CONFIG_SETS[name](48)
    assert configs[0].label == "ar" and configs[0].decode.method == "ar" and not configs[0].transformers
    # a later AR row only as the same target in another dtype (the standard set's bf16 rows) or as transformers' generate
    assert all(c.decode.method == "sd" or c.transformers or c.decode.dtype != configs[0].decode.dtype for c in configs[1:])


@pytest.mark.parametrize("name, draft", [("judge", "draft-s"), ("judge-head", "head")])
def test_judge_sets_are_referenced_to_exact_sd_and_score_quality(name, draft):
    configs = CONFIG_SETS[name](48)
    assert configs[0].label == "exact" and configs[0].decode.accept == "exact" and configs[0].decode.method == "sd"
    assert all(c.quality and c.decode.draft == draft for c in configs)
    assert {c.decode.accept for c in configs[1:]} == {"judge", "lenient", "topk"}


def test_chain_bases_name_an_earlier_row_one_level_shorter():
    configs = CONFIG_SETS["chains"](48)
    drafts = {c.label: set(c.decode.chain or [c.decode.draft]) for c in configs if c.decode.method == "sd"}
    seen = set()
    for c in configs:
        base = c.extra.get("base")
        if base:  # the base row's drafts plus exactly one inserted level
            assert base in seen and drafts[base] < drafts[c.label] and len(drafts[c.label] - drafts[base]) == 1
        seen.add(c.label)
    assert any(c.extra.get("base") for c in configs)


def test_write_results_writes_the_csv_and_per_category_tables(tmp_path):
    configs = [BenchConfig(label, DecodeConfig(method="ar" if label == "ar" else "sd", draft=None if label == "ar" else "draft-s"))
               for label in ("ar", "sd", "hf")]
    out = tmp_path / "bench" / "run"
    write_results(ROWS, configs, out, 32)
    with open(out.with_suffix(".csv")) as f:
        back = list(csv.DictReader(f))
    assert [r["config"] for r in back] == [r["config"] for r in ROWS] and list(back[0]) == list(ROWS[0])
    md = out.with_suffix(".md").read_text()
    assert "3 prompts" in md
    overall = md.split("## Overall")[1].split("## ")[0]
    assert markdown(summary_table(ROWS, ["ar", "sd", "hf"])) in overall
    math_rows = [r for r in ROWS if r["category"] == "math"]
    assert markdown(summary_table(math_rows, ["ar", "sd", "hf"])) in md.split("## math")[1]
    assert "## chat" in md and "Theory" not in md and "Speed and quality" not in md


def test_peer_table_pairs_engine_rows_with_assisted_generation_on_the_same_draft_and_gamma(tmp_path):
    def sd(**kw):
        return DecodeConfig(**{"method": "sd", "draft": "draft-s", "gamma": 4, "gamma_policy": "fixed", **kw})

    configs = [BenchConfig("ar", DecodeConfig(method="ar")), BenchConfig("sd", sd()),
               BenchConfig("hf", sd(), transformers=True), BenchConfig("sd γ=2", sd(gamma=2)),
               BenchConfig("sd full", sd(full_draft_vocab=True)), BenchConfig("sd bf16", sd(dtype="bfloat16"))]
    rows = ROWS + [bench_row(label, pid, 1.0, 1.0, category="math" if pid == "p3" else "chat")
                   for label in ("sd γ=2", "sd full", "sd bf16") for pid in ("p1", "p2", "p3")]
    table = peer_table(rows, configs)
    assert [(r["engine row"], r["peer"]) for r in table] == [("sd", "hf"), ("sd full", "hf")]
    sd_row = table[0]  # per prompt 15/12, 50/22, 36/40
    assert sd_row["engine / peer (median)"] == pytest.approx(1.25) and sd_row["min"] == pytest.approx(0.9)
    assert sd_row["max"] == pytest.approx(50 / 22) and sd_row["prompts"] == 3
    assert table[1]["engine / peer (median)"] == pytest.approx(1 / 22)
    write_results(rows, configs, tmp_path / "run", 32)
    assert markdown(table) in (tmp_path / "run.md").read_text().split("## Rows against their peers")[1]


def test_a_row_can_name_its_peer_as_the_new_head_names_the_old_one_at_the_same_gamma():
    configs = head_configs(32, gammas=(2, 3))
    assert [c.label for c in configs] == ["ar", "head-v1 γ=2", "head-v1 γ=3", "head γ=2", "head γ=3"]
    rows = [bench_row(c.label, pid, 10.0 * (1 + i), 1.0) for i, c in enumerate(configs) for pid in ("p1", "p2")]
    table = peer_table(rows, configs)
    assert [(r["engine row"], r["peer"]) for r in table] == [("head γ=2", "head-v1 γ=2"), ("head γ=3", "head-v1 γ=3")]
    assert table[0]["engine / peer (median)"] == pytest.approx(40 / 20) and table[1]["prompts"] == 2


def test_rotations_start_each_round_at_another_share_of_the_list():
    configs = [BenchConfig(str(k), DecodeConfig(method="ar")) for k in range(6)]
    orders = [[c.label for c in o] for o in rotations(configs, 1, 3)]
    assert orders == [list("123450"), list("345012"), list("501234")]
    assert [[c.label for c in o] for o in rotations(configs, 7, 1)] == [list("123450")]


def test_fastest_runs_keeps_each_configurations_least_disturbed_run(monkeypatch):
    configs = [BenchConfig(label, DecodeConfig(method="ar")) for label in ("a", "b")]
    walls = {"a": iter([3.0, 1.0, 2.0]), "b": iter([0.5, 4.0, 0.7])}
    calls = []

    def fake_run(cfg, prompt, bank):
        calls.append(cfg.label)
        return {"wall_s": next(walls[cfg.label]), "round": calls.count(cfg.label)}

    monkeypatch.setattr("specviz.bench.harness.run_one", fake_run)
    best = fastest_runs("p", configs, None, 0, 3)
    assert len(calls) == 6 and calls.count("a") == calls.count("b") == 3
    assert (best["a"]["wall_s"], best["a"]["round"]) == (1.0, 2)
    assert (best["b"]["wall_s"], best["b"]["round"]) == (0.5, 1)


def test_the_assisted_generation_peer_is_greedy_generate_with_a_constant_gamma(tiny_target, tiny_draft):
    for prompt in PROMPTS:
        ids, wall = hf_generate(tiny_target.model, tiny_draft.model, prompt, 3, 20, [])
        assert ids == reference(tiny_target, prompt, 20) and wall > 0
    config = tiny_draft.model.generation_config
    assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule) == (3, "constant")


def test_the_generate_peer_without_a_draft_is_plain_greedy_generate_on_stock_linears(tiny_target):
    import torch

    from specviz.models.backends.cpu import PackedLinear, is_packed, pack_linears, stock_linears

    model = tiny_llama(vocab=96, hidden=64, layers=2, seed=0, init_std=0.2).model
    pack_linears(model)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    with torch.inference_mode():
        model(torch.arange(20)[None])  # a prefill's rows run the oneDNN kernel, which makes each layer's copy
    copies = [m.packed for m in packed]
    assert all(torch.is_tensor(c) for c in copies)
    with stock_linears(model):
        assert not is_packed(model)  # transformers' own kernels while the peer runs
        ids, wall = hf_generate(tiny_target.model, None, PROMPTS[0], 3, 20, [])
    assert ids == reference(tiny_target, PROMPTS[0], 20) and wall > 0
    stop = threading.Event()
    stop.set()  # the app's Stop: generate ends after the token it is on
    assert ids[:1] == hf_generate(tiny_target.model, None, PROMPTS[0], 3, 20, [], stop=stop)[0]
    assert [m for m in model.modules() if isinstance(m, PackedLinear)] == packed  # the same packed layers, put back
    with pytest.raises(RuntimeError), stock_linears(model):
        raise RuntimeError("a failing peer")
    assert is_packed(model) and all(m.packed is c for m, c in zip(packed, copies))  # not packed again
