"""Unit tests of the token view: escaping, non-colour cues, legend, spans built from StepEvents, settings."""

import re
import threading
import time

import pytest

from specviz.core.errors import ConfigError
from specviz.ui.state import baseline_key, make_config, new_session, put_baseline
from specviz.ui.stream import stream_batches
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
    return {"step": step, "drafter": "ngram", "gamma": len(drafts), "draft_ids": drafts, "draft_q": [1.0] * len(drafts),
            "draft_p": [0.5] * len(drafts), "accepted": accepted, "emitted_ids": emitted, "emitted_p": [0.9] * len(emitted),
            "accept_reasons": reasons, "judge_scores": judge, "draft_ms": 0.1, "verify_ms": 40.0, "overhead_ms": 1.0,
            "total_ms": 41.1, "forward_ms": 40.0, "elapsed_ms": elapsed, "policy": None, "extra": {}}


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
    cut = step_spans(event(2, [1, 2, 3], 3, [1], ["exact", "exact", "exact"]), [0], dec)  # a stop token at the first draft
    assert [s.kind for s in cut] == ["accepted"]


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
    ({"gamma": 1000}, "--gamma must be between"), ({"gamma": None}, "γ is empty"), ({"seed": "abc"}, "seed must be a number"),
    ({"max_new_tokens": -5}, "--max-new-tokens"), ({"temperature": -1}, "--temperature"), ({"top_p": 0}, "--top-p"),
    ({"gamma": 2.5}, "whole number"), ({"lenience": 0}, "lenience"), ({"seed": float("inf")}, "finite"),
])
def test_bad_settings_give_one_line_errors(over, message):
    with pytest.raises(ConfigError, match=message) as info:
        make_config(**settings(**over))
    assert "\n" not in str(info.value)


def test_baseline_key_ignores_draft_settings_and_cache_is_bounded():
    a, b = make_config(**settings(gamma=2)), make_config(**settings(gamma=8, method="ar"))
    assert baseline_key(a, "p") == baseline_key(b, "p") != baseline_key(a, "q")
    assert baseline_key(a, "p") != baseline_key(make_config(**settings(seed=1)), "p")
    session = new_session()
    for i in range(20):
        put_baseline(session, str(i), {"i": i})
    assert len(session["baselines"]) == 8 and "19" in session["baselines"]


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
    assert not any(t.name == "specviz-decode" and t.is_alive() for t in threading.enumerate())


SAMPLING = {"temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 16}


def test_compare_table_reads_chains_and_every_rule():
    from specviz.ui.compare import CONFIG_COLUMNS, comparison_presets, parse_table

    table = [["plain", "sd", "draft-s", 4, "online", "exact", 0.5, 1.0, 5],
             ["chain", "sd", "ngram, draft-s", 4, "fixed", "judge", 0.7, 1.0, 5],
             ["arrow", "sd", "ngram→draft-m", 3, "fsm", "topk", 0.5, 1.0, 9]]
    configs = dict(parse_table(table, "smollm2-offline", SAMPLING))
    assert configs["plain"].draft == "draft-s" and not configs["plain"].chain
    assert configs["chain"].chain == ["ngram", "draft-s"] and configs["chain"].draft is None and configs["chain"].judge_threshold == 0.7
    assert configs["arrow"].chain == ["ngram", "draft-m"] and configs["arrow"].topk == 9
    with pytest.raises(ConfigError, match="row 1.*n-gram drafter can only be the first"):
        parse_table([["bad", "sd", "draft-s,ngram", 4, "fixed", "exact", 0.5, 1.0, 5]], "smollm2-offline", SAMPLING)
    for rows in comparison_presets("smollm2-offline").values():
        assert len(parse_table(rows, "smollm2-offline", SAMPLING)) == len(rows) and len(rows[0]) == len(CONFIG_COLUMNS)


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
