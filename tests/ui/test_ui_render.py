"""Unit tests of the token view: escaping, non-colour cues, legend, spans built from StepEvents, settings."""

import re
import time
from dataclasses import replace

import pytest

from specviz.core.errors import ConfigError
from specviz.core.record import StepEvent
from specviz.runtime.config import DecodeConfig
from specviz.ui.runs import baseline_key, get_baseline, put_baseline
from specviz.ui.state import form_config, new_session
from specviz.ui.stream import model_thread, stream_batches
from specviz.viz import render
from specviz.viz.render import STYLES, TokenSpan, legend_html, span_html, spans_html, token_css
from specviz.viz.trace import PieceDecoder, TraceBuilder, cumulative, reasons_text, step_spans, until

NON_COLOUR = ("text-decoration", "border", "font-style", "font-weight")


class FakeTokenizer:
    """id → text; like sentencepiece, a leading space is dropped at the start of a decode."""

    def __init__(self, vocab: dict[int, str], strip_leading_space: bool = False):
        self.vocab, self.strip = vocab, strip_leading_space

    def decode(self, ids, **_):
        text = "".join(self.vocab[i] for i in ids)
        return text[1:] if self.strip and text.startswith(" ") else text


VOCAB = {0: "<s>", 1: " The", 2: " cat", 3: " sat", 4: " on", 5: " mat", 6: "\n", 7: " dog", 8: "<b>&", 9: " ran"}


def event(step, drafts, accepted, emitted, reasons, elapsed=10.0, judge=None):
    spans = {"deciding": 0.0, "drafting": 0.1, "verifying": 40.0, "committing": 0.5, "recording": 0.5}
    return {"step": step, "drafter": "ngram", "gamma": len(drafts), "drafted": len(drafts), "draft_ids": drafts,
            "draft_q": [1.0] * len(drafts), "draft_p": [0.5] * len(drafts), "accepted": accepted, "emitted_ids": emitted,
            "emitted_p": [0.9] * len(emitted), "accept_reasons": reasons, "judge_scores": judge, "spans": spans,
            "total_ms": 41.1, "forward_ms": 40.0, "elapsed_ms": elapsed, "why": None, "extra": {}}


def cues(kind: str) -> tuple:
    """The non-colour signature of a kind: its CSS minus colours/opacity, plus its text marker."""
    decl = [d.strip() for d in STYLES[kind].css.split(";") if d.strip()]
    kept = tuple(sorted(d for d in decl if d.split(":")[0].strip().startswith(NON_COLOUR)))
    return kept + ((render.MARKERS[kind],) if kind in render.MARKERS else ())


def test_token_text_is_escaped_in_body_and_tooltip():
    nasty = '<script>alert("x")</script> & \'q\''
    out = span_html(TokenSpan(nasty, "accepted", 3, 42, 0.5, 0.25))
    assert "<script>" not in out and "&lt;script&gt;" in out
    title = re.search(r'title="([^"]*)"', out).group(1)
    assert "<" not in title and "&quot;" not in out.split("title=")[0]
    assert "step 3" in title and "p=0.500" in title and "q=0.250" in title and "judge=–" in title and "id 42" in title


def test_whitespace_and_control_characters_are_visible():
    out = span_html(TokenSpan("a\nb\x07", "target", 1))
    assert "↵" in out and "\n" in out and "␇" in out
    assert "∅" in span_html(TokenSpan("", "target", 1))


def test_every_style_has_a_distinct_non_colour_cue():
    signatures = {kind: cues(kind) for kind in STYLES}
    assert len(set(signatures.values())) == len(STYLES), signatures
    plain = [k for k, sig in signatures.items() if not sig]
    assert plain == ["target"], "only the plain target token may go without a mark"
    css = token_css()
    for kind in STYLES:
        assert f".sv-{kind} " in css
    assert "line-through" in STYLES["rejected"].css and "line-through" in STYLES["unchecked"].css


def test_legend_shows_every_kind_with_its_cue():
    legend = legend_html()
    for kind, style in STYLES.items():
        assert f'data-kind="{kind}"' in legend
        assert style.label.replace("'", "&#x27;") in legend and style.cue in legend


def test_spans_of_a_step_with_rejection_and_of_a_bonus_step():
    dec = PieceDecoder(FakeTokenizer(VOCAB))
    spans = step_spans(event(1, [1, 2, 7, 4], 2, [1, 2, 3], ["exact", "exact", "rejected", "unchecked"]), [0], dec)
    assert [(s.text, s.kind) for s in spans] == [(" The", "accepted"), (" cat", "accepted"), (" dog", "rejected"),
                                                 (" on", "unchecked"), (" sat", "correction")]
    bonus = step_spans(event(2, [4, 5], 2, [4, 5, 6], ["exact", "exact"]), [3], dec)
    assert [s.kind for s in bonus] == ["accepted", "accepted", "bonus"]
    plain = step_spans(event(3, [], 0, [9], []), [6], dec)
    assert [(s.text, s.kind) for s in plain] == [(" ran", "target")]


def test_judge_and_relaxed_reasons_and_stop_truncation():
    dec = PieceDecoder(FakeTokenizer(VOCAB))
    spans = step_spans(event(1, [1, 2, 3], 3, [1, 2, 3, 4], ["judge", "lenient", "topk"], judge=[0.9, 0.1, 0.2]), [0], dec)
    assert [s.kind for s in spans] == ["judge", "relaxed", "relaxed", "bonus"]
    assert spans[0].judge == 0.9
    cut = step_spans(event(2, [1, 2, 3], 1, [1], ["exact", "unchecked", "unchecked"]), [0], dec)  # a stop token at the first draft
    assert [s.kind for s in cut] == ["accepted"]
    older = step_spans(event(2, [1, 2, 3], 3, [1], ["exact", "exact", "exact"]), [0], dec)  # recorded before records ended there
    assert [s.kind for s in older] == ["accepted"]


def test_piece_decoder_uses_context_for_leading_spaces():
    dec = PieceDecoder(FakeTokenizer(VOCAB, strip_leading_space=True))
    assert dec.piece([1], 2) == " cat"  # decoded alone it would lose its space


def test_trace_builder_rows_and_cumulative():
    b = TraceBuilder(FakeTokenizer(VOCAB), [0])
    b.add(event(1, [1, 2], 1, [1, 3], ["exact", "rejected"], elapsed=100.0))
    b.add(event(2, [], 0, [8], [], elapsed=150.0))
    assert b.new_tokens == 3 and len(b.rows) == 2
    assert b.rows[0][3] == "1 / 2" and b.rows[0][4] == "✓✗" and b.rows[0][6] == " The sat"
    assert cumulative(b.events) == ([0.0, 0.1, 0.15], [0, 2, 3])
    assert [e["step"] for e in until(b.events, 0.12)] == [1]
    html = spans_html(b.spans)
    assert "&lt;b&gt;&amp;" in html and html.count('class="sv-tok') == 4
    assert reasons_text(["exact", "judge", "weird"]) == "✓JW"



def settings(**over):
    base = dict(preset="smollm2-offline", method="sd", draft="ngram", gamma=4, gamma_policy="fixed", accept="exact",
                judge_threshold=0.5, lenience=1.0, topk=5, temperature=0, top_p=1, seed=0, max_new_tokens=16, chat=True)
    return {**base, **over}


@pytest.mark.parametrize("over, message", [
    ({"gamma": 1000}, "“γ” must be between 1 and 10"), ({"gamma": None}, "“γ” is empty"), ({"seed": "abc"}, "“seed” must be a number"),
    ({"max_new_tokens": -5}, "“max new tokens”"), ({"temperature": -1}, "“temperature”"), ({"top_p": 0}, "“top-p”"),
    ({"gamma": 2.5}, "whole number"), ({"lenience": 0}, "“lenience”"), ({"seed": float("inf")}, "finite"),
    ({"select": ["ngram", "draft-s"], "method": "ar"}, "“Select among drafts” chooses the draft per step: use it with “Method” sd"),
])
def test_bad_settings_give_one_line_errors_naming_the_controls(over, message):
    from specviz.ui.handlers import user_message

    with pytest.raises(ConfigError) as info:
        form_config(settings(**over))
    assert message in user_message(info.value) and "--" not in user_message(info.value)
    assert "\n" not in str(info.value)


def test_a_form_ignores_the_draft_box_while_a_chain_or_selection_names_the_drafts():
    assert form_config(settings(select="ngram, draft-s")).select == ["ngram", "draft-s"]
    chained = form_config(settings(chain=["ngram", "draft-s"]))
    assert chained.chain == ["ngram", "draft-s"] and chained.draft is None
    assert form_config(settings(chat="false")).chat is False and form_config(settings(chat="true")).chat is True


def test_baseline_key_ignores_draft_settings_and_cache_is_bounded():
    a, b = form_config(settings(gamma=2)), form_config(settings(gamma=8, method="ar"))
    c = form_config(settings(select=["ngram", "draft-s"], gamma_policy="online", accept="judge"))
    assert baseline_key(a, "p") == baseline_key(b, "p") == baseline_key(c, "p") != baseline_key(a, "q")
    assert baseline_key(a, "p") != baseline_key(form_config(settings(seed=1)), "p")
    session = new_session()
    for i in range(20):
        put_baseline(session, DecodeConfig(seed=i), "p", {"i": i})
    assert len(session["baselines"]) == 8 and get_baseline(session, DecodeConfig(seed=19, gamma=5), "p") == {"i": 19}
    assert get_baseline(session, DecodeConfig(seed=0), "p") is None


def test_stream_batches_hands_over_first_event_at_once_and_propagates_errors():
    def slow(n, fail=False):
        for i in range(n):
            time.sleep(0.02)
            yield i
        if fail:
            raise ValueError("boom")

    batches = list(stream_batches(slow(10), every_s=0.05))
    assert batches[0] == [0] and sum(batches, []) == list(range(10)) and len(batches) < 10
    with pytest.raises(ValueError, match="boom"):
        list(stream_batches(slow(3, fail=True)))


def test_closing_the_stream_stops_the_worker():
    produced = []

    def endless():
        i = 0
        while True:
            time.sleep(0.01)
            produced.append(i)
            yield i
            i += 1

    gen = stream_batches(endless(), every_s=0.01)
    next(gen)
    gen.close()
    time.sleep(0.1)
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count
    assert model_thread().submit(lambda: "free").result(timeout=1) == "free"  # the model thread is free for the next run


SHARED = {"preset": "smollm2-offline", "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 16}


def test_compare_table_reads_chains_and_every_rule():
    import pandas as pd

    from specviz.ui.comparison import CONFIG_COLUMNS, parse_table

    table = pd.DataFrame([{"label": "plain", "Draft": "draft-s", "γ": 4, "γ policy": "online"},
                          {"label": "chain", "Draft": "draft-m", "Chain": "ngram, draft-s", "Acceptance rule": "judge",
                           "judge threshold δ": 0.7},
                          {"label": "selection", "select": "draft-s,ngram", "top-k": 9, "accept": "topk"}])
    configs = dict(parse_table(table, SHARED))
    assert configs["plain"].draft == "draft-s" and not configs["plain"].chain and configs["plain"].gamma_policy == "online"
    assert configs["chain"].chain == ["ngram", "draft-s"] and configs["chain"].draft is None and configs["chain"].judge_threshold == 0.7
    assert configs["selection"].select == ["draft-s", "ngram"] and configs["selection"].topk == 9
    assert all(c.seed == 0 and c.max_new_tokens == 16 for c in configs.values())
    assert "temperature" not in CONFIG_COLUMNS and "γ" in CONFIG_COLUMNS  # the baseline's settings are shared, not per row
    with pytest.raises(ConfigError, match="row 1.*n-gram drafter can only be the first"):
        parse_table(pd.DataFrame([{"label": "bad", "chain": "draft-s,ngram"}]), SHARED)
    with pytest.raises(ConfigError, match="unknown column 'colour'"):
        parse_table(pd.DataFrame([{"label": "bad", "colour": "red"}]), SHARED)


def test_ready_made_comparisons_are_configs_over_every_registered_strategy():
    from specviz.core.registry import ACCEPT_RULES, GAMMA_POLICIES
    from specviz.ui.comparison import MAX_CONFIGS, comparison_presets, parse_table, table_of

    tables = comparison_presets("smollm2-offline")
    configs = [c for rows in tables.values() for _, c in rows]
    assert {c.gamma_policy for c in configs} == set(GAMMA_POLICIES) and {c.accept for c in configs} == set(ACCEPT_RULES)
    assert any(c.chain for c in configs)
    for rows in tables.values():
        assert 2 <= len(rows) <= MAX_CONFIGS
        assert parse_table(table_of(rows), SHARED) == [(label, replace(c, max_new_tokens=16)) for label, c in rows]


def test_compare_opens_on_gamma_policies_and_shows_only_the_columns_its_rows_read():
    from specviz.models.presets import PRESETS
    from specviz.ui.compare import show_columns
    from specviz.ui.comparison import ROW_SETTINGS, comparison_presets, default_table, parse_table, table_of

    best = PRESETS["smollm2-offline"].fixed_gamma
    first = default_table("smollm2-offline")
    assert list(first["label"]) == [f"fixed γ={best}", "online", "fsm", "hf-heuristic"]
    assert list(first.columns) == ["label", "Draft", "γ", "γ policy"]  # every row reads only these
    tables = comparison_presets("smollm2-offline")
    rules = table_of(next(rows for name, rows in tables.items() if name.startswith("acceptance rules")))
    assert {"judge threshold δ", "lenience", "top-k"} <= set(rules.columns)
    cells = rules.set_index("label")
    assert cells.loc["judge", "judge threshold δ"] == 0.5 and cells.loc["exact", "judge threshold δ"] == ""  # not read there
    assert cells.loc["exact", "top-k"] == "" and cells.loc["topk", "top-k"] == 5
    trees = [("chain", DecodeConfig(draft="head", gamma=3, gamma_policy="fixed")),
             ("tree", DecodeConfig(draft="head", tree_nodes=8, gamma_policy="fixed"))]
    table = table_of(trees)
    assert {"tree nodes", "tree branching", "tree kind"} <= set(table.columns) and table.set_index("label").loc["tree", "γ"] == ""
    assert parse_table(table, SHARED) == [(label, replace(c, max_new_tokens=16)) for label, c in trees]
    every = table_of(trees, every_setting=True)
    assert len(every.columns) == 1 + len(ROW_SETTINGS) and parse_table(every, SHARED) == parse_table(table, SHARED)
    assert list(show_columns(every, False, "smollm2-offline").columns) == list(table.columns)
    assert list(show_columns(table, True, "smollm2-offline").columns) == list(every.columns)


def test_traces_open_in_explore_without_a_model_and_bad_files_show_an_error(tmp_path):
    from pathlib import Path

    from specviz.ui.explore import gallery, open_example, open_trace

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    status = list(open_trace(str(bad), None))[-1][0]
    assert "sv-status-error" in status and "not a specviz trace" in status
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "trace_v1.json"
    session = new_session()
    shown = list(open_trace(str(fixture), session))[-1]
    assert "Loaded trace" in shown[0] and 'class="sv-tok' in shown[2] and "sv-mic" in shown[9] and "Step " in shown[8]
    assert session["last"]["theory"] and session["views"]["explore"]["steps"]  # Explain and the step panel read it
    assert len(gallery()) >= 10
    assert all('class="sv-tok' in list(open_example(label, None))[-1][2] for label in gallery())


def test_a_streaming_run_redraws_a_few_times_a_second_and_its_charts_less_or_at_the_end(monkeypatch):
    import plotly.graph_objects as go

    from specviz.runtime.prepare import RunPlan
    from specviz.ui import explore, runs

    tokenizer = FakeTokenizer(VOCAB)
    tokenizer.batch_decode = lambda ids: [tokenizer.decode(i) for i in ids]

    def steps(settings, prompt):
        for k in range(1, 101):
            time.sleep(0.01)  # a fast decode: 100 steps a second
            yield [StepEvent.from_dict(event(k, [1], 1, [1, 2], ["exact"], elapsed=10.0 * k))]

    monkeypatch.setattr(runs, "decode_steps", steps)
    monkeypatch.setattr(explore, "CHARTS_EVERY_S", 0.3)  # the real pace draws no live chart in a run this short
    live = runs.Live(RunPlan(DecodeConfig(max_new_tokens=200), tokenizer, [0], "target"))
    start = time.perf_counter()
    frames = list(explore._stream_main(live, "p", live.plan.config, None, "", {}))
    seconds = time.perf_counter() - start
    assert len(live.events) == 100 and live.new_tokens == 200  # every step is recorded, drawn or not
    assert 1 <= len(frames) <= seconds / runs.REDRAW_EVERY_S + 1
    races = [isinstance(f[3], go.Figure) for f in frames]
    assert not races[0]  # not while the decode starts
    assert 1 <= sum(races) <= seconds / 0.3
    assert not any(isinstance(f[4], go.Figure) for f in frames)  # the per-step charts wait for the final frame


def test_the_app_queue_polls_at_a_pace_the_decode_can_share():
    import gradio as gr

    from specviz.ui.app import QUEUE_POLL_S, build_app

    names = ("sleep_when_free", "progress_update_sleep_when_free")
    with gr.Blocks() as plain:
        gr.Markdown("")
    assert set(names) <= set(vars(plain.queue()._queue))  # gradio's own intervals, so setting them takes effect
    queue = build_app()._queue
    assert tuple(getattr(queue, name) for name in names) == QUEUE_POLL_S


def test_the_headline_says_what_the_ratio_says():
    from specviz.viz.render import Headline, headline_html

    def label(ratio: float) -> str:
        return re.search(r"speedup vs AR \(([^)]*)\)", headline_html(Headline(ratio, 10.0, 10.0 / ratio, 1.0, None, 5, 1.0)))[1]

    assert [label(r) for r in (1.3, 1.005, 0.995, 0.7)] == ["faster than AR", "as fast as AR", "as fast as AR", "slower than AR"]


def test_a_choice_shows_only_its_own_description_and_the_settings_it_reads():
    from specviz.core.registry import ACCEPT_RULES, GAMMA_POLICIES
    from specviz.ui.controls import describe, readers, reads, setting_control

    control = setting_control("accept", "t")
    assert control.info == describe("accept", "exact") == "exact: " + ACCEPT_RULES.entry("exact").description
    assert not any(e.description in control.info for e in ACCEPT_RULES.entries() if e.name != "exact")
    assert describe("gamma_policy", "online") == "online: " + GAMMA_POLICIES.entry("online").description
    assert set(readers()) == {"gamma", "judge_threshold", "lenience", "topk"}
    assert reads("judge_threshold", "judge") and not reads("judge_threshold", "exact") and reads("topk", "topk")
    assert reads("gamma", "fsm") and not reads("gamma", "rl") and not reads("gamma", "confidence")


def test_the_headline_shows_the_speedup_over_transformers_generate_beside_the_one_over_ar():
    from specviz.bench.harness import generate_figure
    from specviz.viz.render import Headline, headline_html

    figure = generate_figure({"tokens_per_s": 12.5, "wall_s": 2.56, "new_tokens": 32, "token_ids": [1, 2]}, [1, 2], sampled=False)
    cards = re.findall(r'sv-card-value">([^<]*)</div><div class="sv-card-label">([^<]*)</div>(?:<div class="sv-card-hint">([^<]*))?',
                       headline_html(Headline(1.5, 30.0, 20.0, 2.0, 0.5, 32, 1.07, "AR measured after the run", figure)))
    assert cards[0][:2] == ("1.50×", "speedup vs AR (faster than AR)")
    value, label, hint = cards[1]
    assert (value, label) == ("2.40×", "speedup vs transformers&#x27; generate")  # 30 / 12.5
    assert "generate 12.5 tok/s, stock kernels" in hint and "same tokens as AR: yes" in hint and "faster than generate" in hint
    differs = {**figure, "same_tokens_as_ar": False}
    assert "same tokens as AR: no" in headline_html(Headline(1.5, 30.0, 20.0, 2.0, 0.5, 32, 1.0, "", differs))
    sampled = generate_figure({"tokens_per_s": 40.0, "wall_s": 0.8, "new_tokens": 32, "token_ids": [3]}, [1], sampled=True)
    shown = headline_html(Headline(1.5, 30.0, 20.0, 2.0, 0.5, 32, 1.0, "", sampled))
    assert "0.75×" in shown and "slower than generate" in shown and "tokens not comparable" in shown
    failed = headline_html(Headline(1.5, 30.0, 20.0, 2.0, 0.5, 32, 1.0, "", {"error": "cannot load model 'x'"}))
    assert "not measured: cannot load model" in failed and "×</div><div class=\"sv-card-label\">speedup vs transformers" not in failed
    assert "transformers" not in headline_html(Headline(1.5, 30.0, 20.0, 2.0, 0.5, 32, 1.0))  # not asked for: no card


def test_compare_metrics_have_a_speedup_over_transformers_generate_from_the_same_rounds():
    import pandas as pd

    from specviz.ui.comparison import GENERATE_LABEL, METRIC_COLUMNS, Comparison, metrics_table
    from specviz.ui.runs import AR_LABEL

    def record(tps: float, ids: list[int], steps: bool = True) -> dict:
        metrics = {"new_tokens": 4, "wall_s": 4 / tps, "tokens_per_s": tps}
        if steps:
            metrics.update(mean_accept_len=1.0, accept_rate=0.0, drafted=0, draft_ms=0.0, verify_ms=1.0, overhead_ms=0.1)
        return {"metrics": metrics, "token_ids": ids}

    comp = Comparison("p", [AR_LABEL, GENERATE_LABEL, "sd"], {}, n_rounds=2)
    comp.rounds = {AR_LABEL: [record(10, [1]), record(20, [1])], GENERATE_LABEL: [record(20, [1], False), record(25, [2], False)],
                   "sd": [record(30, [1]), record(40, [1])]}
    comp.order = [f"{label}#{k}" for k in (1, 2) for label in comp.labels]
    table = metrics_table(comp).set_index("config")
    assert "speedup vs transformers generate" in METRIC_COLUMNS
    column = table["speedup vs transformers generate"]
    assert column["sd"] == 1.55 and column[AR_LABEL] == 0.65 and column[GENERATE_LABEL] == 1.0  # medians of 1.5, 1.6 / 0.5, 0.8
    assert table.loc[GENERATE_LABEL, "speedup vs AR"] == 1.625 and table.loc[GENERATE_LABEL, "same tokens as AR"] == "no"
    assert pd.isna(table.loc[GENERATE_LABEL, "mean accepted len"]) and table.loc["sd", "mean accepted len"] == 1.0  # it has no steps


def test_a_runs_export_is_shown_ready_to_copy_or_with_why_not():
    from specviz.runtime.serving import serving_export

    ngram = render.serving_html(serving_export(DecodeConfig(draft="ngram", gamma_policy="fixed", gamma=3)))
    assert "--speculative-config '{&quot;method&quot;: &quot;ngram&quot;" in ngram and "--speculative-num-draft-tokens 4" in ngram
    online = render.serving_html(serving_export(DecodeConfig(draft="ngram", gamma_policy="online")))
    assert "sv-status-info" in online and "serving engines draft a fixed γ" in online
    assert "No export" in render.serving_html(None)
    evil = render.serving_html({"vllm_speculative_config": {"model": "<script>x</script>"}, "sglang_args": ["<b>"]})
    assert "<script>" not in evil and "<b>" not in evil.replace("<b>Serve", "")
