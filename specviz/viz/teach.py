"""Teaching views of one step: a narration in plain words and the verification microscope.

Both read a step as recorded (a StepEvent's dict, live or from a trace file) and a map from token id to its text,
so they work the same for a live run, a finished run and a loaded trace with no model. The microscope shows, per
verified position, p and q over their top tokens, min(1, p/q) with the uniform draw u that decided it, the residual
distribution at a rejection, the judge score against δ, and a chain's per-level blocks.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

REASON_WORDS = {"exact": "the exact test", "judge": "the judge", "lenient": "lenience", "topk": "the top-k rule"}


def piece(pieces: Mapping[int, str], token: int) -> str:
    """A token's text as a short quoted label (newlines and spaces made visible)."""
    text = pieces.get(token, pieces.get(str(token), f"#{token}"))  # JSON turns int keys into strings
    return repr(text)[1:-1].replace(" ", "␣") or "∅"


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def narrate(event: Mapping, pieces: Mapping[int, str], plain_ms_per_token: float | None = None) -> str:
    """The step in plain words: what was drafted, what the target kept and why, what it emitted instead, and how
    long the step took against plain decoding of the same tokens."""
    drafts, emitted, verify = list(event["draft_ids"]), list(event["emitted_ids"]), list(event.get("verify") or [])
    words = [f"Step {event['step']}."]
    if not drafts:
        words.append(f"Nothing was drafted: the target ran one plain step and emitted {piece(pieces, emitted[0])}." if emitted
                     else "Nothing was drafted.")
    else:
        listed = ", ".join(piece(pieces, t) for t in drafts)
        words.append(f"{event['drafter']} drafted {len(drafts)} token{'s' * (len(drafts) > 1)} (γ = {event['gamma']}): {listed}.")
        for i, v in enumerate(verify):
            words.append(_verdict_words(i + 1, v, pieces))
        unchecked = len(drafts) - len(verify)
        if unchecked:
            words.append("The draft after the rejection was never checked." if unchecked == 1
                         else f"The {unchecked} drafts after the rejection were never checked.")
        if len(emitted) > event["accepted"]:
            extra = emitted[event["accepted"]]
            bonus = event["accepted"] == len(drafts)
            how = "as the bonus token, from p after the last draft" if bonus else "in place of the rejected draft"
            words.append(f"The target then emitted {piece(pieces, extra)} {how}.")
    took = f"The step took {event['total_ms']:.1f} ms (draft {event['draft_ms']:.1f}, verify {event['verify_ms']:.1f})"
    if plain_ms_per_token:
        words.append(f"{took}; plain decoding would have taken about {plain_ms_per_token * len(emitted):.1f} ms for these "
                     f"{len(emitted)} token{'s' * (len(emitted) != 1)}.")
    else:
        words.append(f"{took} for {len(emitted)} token{'s' * (len(emitted) != 1)}; no AR baseline to compare with.")
    return " ".join(words)


def _verdict_words(position: int, v: Mapping, pieces: Mapping[int, str]) -> str:
    token = piece(pieces, v["token"])
    if v["u"] is None:  # greedy: the argmax comparison
        if v["accepted"] and v["reason"] == "exact":
            return f"Draft {position}, {token}, is the target's most likely token (p = {_f(v['p'])}): accepted."
        if v["accepted"]:
            return f"Draft {position}, {token}, is not the target's argmax (p = {_f(v['p'])}) but {REASON_WORDS[v['reason']]} accepted it."
        return f"Draft {position}, {token}, is not the target's argmax (p = {_f(v['p'])}): rejected."
    test = f"p = {_f(v['p'])}, q = {_f(v['q'])}, min(1, p/q) = {_f(v['accept_prob'])}, u = {_f(v['u'])}"
    if v["reason"] == "exact":
        return f"Draft {position}, {token}: {test}; u < p/q, so the exact test accepted it."
    if v["accepted"]:
        return f"Draft {position}, {token}: {test}; the exact test would reject it, {REASON_WORDS[v['reason']]} accepted it."
    return f"Draft {position}, {token}: {test}; u ≥ p/q: rejected, and the correction is drawn from norm(max(0, p − q))."


def _bars(rows: Sequence[tuple[str, float | None, float | None]], marked: int | None = None) -> str:
    """A two-column bar table (p and q) over token labels; row ``marked`` is highlighted."""
    out = ['<table class="sv-mic-bars"><tr><th>token</th><th>p (target)</th><th>q (draft)</th></tr>']
    for i, (label, p, q) in enumerate(rows):
        cls = ' class="sv-mic-mark"' if i == marked else ""
        cells = "".join(f'<td><span class="sv-bar sv-bar-{name}" style="width:{100 * (x or 0):.1f}%"></span>'
                        f'<span class="sv-bar-num">{_f(x)}</span></td>' for name, x in (("p", p), ("q", q)))
        out.append(f"<tr{cls}><td><code>{html.escape(label)}</code></td>{cells}</tr>")
    return "".join(out) + "</table>"


def _top_rows(v: Mapping, pieces: Mapping[int, str]) -> tuple[list[tuple[str, float | None, float | None]], int]:
    p, q = {int(i): x for i, x in v["p_top"]}, {int(i): x for i, x in v["q_top"]}
    ids = list(dict.fromkeys([v["token"], *p, *q]))[:12]
    return [(piece(pieces, i), p.get(i, v["p"] if i == v["token"] else None), q.get(i, v["q"] if i == v["token"] else None))
            for i in ids], 0


def _accept_bar(v: Mapping) -> str:
    """min(1, p/q) as a bar, with u drawn as a line where it fell."""
    prob = v["accept_prob"]
    line = "" if v["u"] is None else f'<span class="sv-u" style="left:{100 * v["u"]:.1f}%" title="u = {_f(v["u"])}"></span>'
    label = f"min(1, p/q) = {_f(prob)}" + ("" if v["u"] is None else f", u = {_f(v['u'])}") if v["u"] is not None else (
        f"greedy: accept iff the draft is the target's argmax → {int(prob)}")
    return (f'<div class="sv-accept"><span class="sv-accept-fill" style="width:{100 * prob:.1f}%"></span>{line}</div>'
            f'<div class="sv-accept-label">{html.escape(label)}</div>')


def microscope_html(event: Mapping, pieces: Mapping[int, str]) -> str:
    """The verification microscope of one step (see the module docstring)."""
    verify = list(event.get("verify") or [])
    if not verify:
        return f'<div class="sv-mic"><p>Step {event["step"]}: nothing was drafted, so nothing was verified.</p></div>'
    parts = [f'<div class="sv-mic"><p class="sv-mic-title">Step {event["step"]}: the target verified {len(verify)} of '
             f'{len(event["draft_ids"])} drafted token(s)</p>']
    for i, v in enumerate(verify):
        verdict = f"accepted ({v['reason']})" if v["accepted"] else "rejected"
        parts.append(f'<div class="sv-mic-pos sv-mic-{"ok" if v["accepted"] else "no"}" data-position="{i + 1}">'
                     f'<b>Draft {i + 1}: <code>{html.escape(piece(pieces, v["token"]))}</code> — {verdict}</b>'
                     f'<div class="sv-mic-nums">p = <b class="sv-p">{_f(v["p"])}</b> · q = <b class="sv-q">{_f(v["q"])}</b> · '
                     f'min(1, p/q) = <b class="sv-ap">{_f(v["accept_prob"])}</b> · u = <b class="sv-uval">{_f(v["u"])}</b></div>')
        parts.append(_accept_bar(v))
        rows, marked = _top_rows(v, pieces)
        parts.append(_bars(rows, marked))
        if "score" in v:
            parts.append(f'<div class="sv-judge">judge score {_f(v["score"])} against δ = {_f(v["threshold"], 2)}: '
                         f'{"above" if v["score"] > v["threshold"] else "not above"} δ</div>')
        if v.get("residual_top"):
            res = v["residual_top"]
            rows = [(piece(pieces, int(t)), x, None) for t, x in res["top"]]
            mark = next((k for k, (t, _) in enumerate(res["top"]) if int(t) == res["emitted"]), None)
            parts.append(f'<div class="sv-mic-res">Residual norm(max(0, p − q)), the correction drawn: '
                         f'<code>{html.escape(piece(pieces, res["emitted"]))}</code></div>' + _bars(rows, mark))
        if v.get("argmax") is not None:
            parts.append(f'<div class="sv-mic-res">Target argmax: <code>{html.escape(piece(pieces, v["argmax"]))}</code>'
                         f'{" = the draft" if v["argmax"] == v["token"] else " ≠ the draft: emitted instead"}</div>')
        parts.append("</div>")
    parts.append(_levels_html(event, pieces))
    return "".join(parts) + "</div>"


def _levels_html(event: Mapping, pieces: Mapping[int, str]) -> str:
    """A chain's levels: per verification, what the level below drafted and what this level passed up."""
    levels = [lv for lv in (event.get("extra") or {}).get("levels", []) if lv.get("blocks")]
    if not levels:
        return ""
    rows = []
    for lv in levels:
        for block in lv["blocks"]:
            drafted = " ".join(piece(pieces, t) for t in block["drafted"]) or "∅"
            passed = " ".join(piece(pieces, t) for t in block["passed"])
            rows.append(f"<tr><td>{html.escape(lv['name'])}</td><td><code>{html.escape(drafted)}</code></td>"
                        f"<td><code>{html.escape(passed)}</code></td></tr>")
    return ('<table class="sv-mic-levels"><tr><th>level</th><th>drafted below</th><th>passed up</th></tr>' + "".join(rows)
            + "</table>")


def microscope_css() -> str:
    return """
.sv-mic { font-size: 14px; }
.sv-mic-title { font-weight: 600; margin: 4px 0; }
.sv-mic-pos { border: 1px solid #d0d7de; border-radius: 6px; padding: 6px 8px; margin: 6px 0; }
.sv-mic-ok { border-left: 4px solid #2da44e; } .sv-mic-no { border-left: 4px solid #cf222e; }
.sv-accept { position: relative; height: 14px; background: #eef1f4; border-radius: 3px; margin: 4px 0 2px; }
.sv-accept-fill { position: absolute; left: 0; top: 0; bottom: 0; background: #8fd19e; border-radius: 3px; }
.sv-u { position: absolute; top: -3px; bottom: -3px; width: 2px; background: #cf222e; }
.sv-accept-label { font-size: 12px; color: #57606a; }
.sv-mic-bars { border-collapse: collapse; margin: 4px 0; font-size: 12px; }
.sv-mic-bars td, .sv-mic-bars th { padding: 1px 6px; text-align: left; }
.sv-mic-bars td:nth-child(2), .sv-mic-bars td:nth-child(3) { width: 150px; position: relative; }
.sv-bar { display: inline-block; height: 9px; vertical-align: middle; margin-right: 4px; max-width: 90px; }
.sv-bar-p { background: #4c6ef5; } .sv-bar-q { background: #f59f00; }
.sv-mic-mark { background: #fff3bf; font-weight: 600; }
.sv-judge, .sv-mic-res { font-size: 12px; margin-top: 4px; }
.sv-mic-levels { font-size: 12px; border-collapse: collapse; } .sv-mic-levels td { padding: 1px 6px; }
.sv-narration { font-size: 15px; line-height: 1.5; }
"""


def highlight_css(step: int) -> str:
    """Marks the spans of one step in the token view (spans carry ``data-step``)."""
    return f'.sv-tok[data-step="{int(step)}"] {{ outline: 2px solid #cf222e; outline-offset: 1px; }}'
