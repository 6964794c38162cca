"""Teaching views of one step: a narration in plain words and the verification microscope.

Both read a step as recorded (a StepEvent's dict, live or from a trace file) and a map from token id to its text,
so they work the same for a live run, a finished run and a loaded trace with no model. The microscope shows, per
verified position, p and q over their top tokens, min(1, p/q) with the uniform draw u that decided it, the residual
distribution at a rejection, the judge score against δ, and a chain's per-level blocks. A step that drafted a token
tree is drawn as that tree (depth left to right, siblings stacked; nodes are tokens, each with a dot sized by its q or,
toggled, its p; the accepted path highlighted, rejected siblings marked, nodes never checked dimmed; each node opens
its own microscope card: the context it was drafted after, q at its stage, p after the siblings rejected before it,
u and the test that decided it, or why it was never checked), and its narration says which branch won and why.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from specviz.viz.trace import ended_at_stop, layout, value_at

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
    if event.get("tree") and drafts:
        words.append(tree_narration(event, pieces))
    elif event.get("untold") and drafts:
        return server_narration(event, pieces)
    elif not drafts:
        words.append(f"Nothing was drafted: the target ran one plain step and emitted {piece(pieces, emitted[0])}." if emitted
                     else "Nothing was drafted.")
    else:
        listed = ", ".join(piece(pieces, t) for t in drafts)
        words.append(f"{event['drafter']} drafted {len(drafts)} token{'s' * (len(drafts) > 1)} (γ = {event['gamma']}): {listed}.")
        for i, v in enumerate(verify):
            words.append(_verdict_words(i + 1, v, pieces))
        stopped = ended_at_stop(event)
        if stopped:
            words.append(stop_words(emitted[-1], pieces))
        unchecked, after = len(drafts) - len(verify), "the stop token" if stopped else "the rejection"
        if unchecked:
            words.append(f"The draft after {after} was never checked." if unchecked == 1
                         else f"The {unchecked} drafts after {after} were never checked.")
        if not stopped:
            extra = emitted[event["accepted"]]
            bonus = event["accepted"] == len(drafts)
            how = "as the bonus token, from p after the last draft" if bonus else "in place of the rejected draft"
            words.append(f"The target then emitted {piece(pieces, extra)} {how}.")
    spans = event["spans"]
    took = f"The step took {event['total_ms']:.1f} ms (drafting {spans['drafting']:.1f}, verifying {spans['verifying']:.1f})"
    if plain_ms_per_token:
        words.append(f"{took}; plain decoding would have taken about {plain_ms_per_token * len(emitted):.1f} ms for these "
                     f"{len(emitted)} token{'s' * (len(emitted) != 1)}.")
    else:
        words.append(f"{took} for {len(emitted)} token{'s' * (len(emitted) != 1)}; no AR baseline to compare with.")
    return " ".join(words)


def server_narration(event: Mapping, pieces: Mapping[int, str]) -> str:
    """A server's step: what it drafted and kept, in the server's own counts, and what it does not tell."""
    drafts, emitted, kept = list(event["draft_ids"]), list(event["emitted_ids"]), event["accepted"]
    words = [f"Step {event['step']}. {event['drafter']} drafted {len(drafts)} token{'s' * (len(drafts) != 1)} "
             f"(γ = {event['gamma']}) and the target kept {kept}"
             + (f": {', '.join(piece(pieces, t) for t in drafts[:kept])}." if kept else ".")]
    if len(emitted) > kept:
        how = "as the bonus token" if kept == len(drafts) else "in place of the first rejected draft"
        words.append(f"The target then emitted {piece(pieces, emitted[kept])} {how}.")
    words.append(f"The server does not tell {', '.join(UNTOLD_WORDS.get(u, u) for u in event['untold'])}.")
    return " ".join(words)


UNTOLD_WORDS = {"rejected_ids": "which tokens it rejected", "p": "the target's p", "q": "the draft's q",
                "times": "the step's time"}


def stop_words(token: int, pieces: Mapping[int, str]) -> str:
    """What a stop token among the accepted drafts did to the step."""
    return f"{piece(pieces, token)} is a stop token: the output ends there, and the target adds no token of its own."


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
    if event.get("tree") and event["draft_ids"]:
        return tree_microscope(event, pieces)
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
.sv-tree-view { margin: 6px 0; font-size: 12px; color: #57606a; }
.sv-tree-toggle { cursor: pointer; margin-right: 8px; white-space: nowrap; }
.sv-tree-box { contain: inline-size; overflow: auto; max-height: 70vh; }
.sv-tree { display: block; margin: 6px 0; width: var(--sv-w); max-width: 100%; min-width: calc(.75 * var(--sv-w)); height: auto;
  font: 13px ui-monospace, monospace; }
body.sv-present .sv-tree, body.present .sv-tree { width: calc(1.5 * var(--sv-w)); min-width: calc(1.1 * var(--sv-w)); }
.sv-dot.sv-enc-q { fill: #f59f00; } .sv-dot.sv-enc-p { fill: #4c6ef5; }
.sv-dot.sv-dot-none { fill: none; stroke: #57606a; stroke-dasharray: 2 1.5; }
.sv-tree-view .sv-enc-p, .sv-tree-view:has(.sv-enc-toggle:checked) .sv-enc-q { display: none; }
.sv-tree-view:has(.sv-enc-toggle:checked) .sv-enc-p { display: inline; }
.sv-node rect { fill: #fff; stroke: #8c959f; stroke-width: 1.2; }
.sv-node.sv-path rect { fill: #dafbe1; stroke: #2da44e; stroke-width: 2; }
.sv-node.sv-rejected rect { fill: #ffebe9; stroke: #cf222e; }
.sv-node.sv-unchecked { opacity: .5; } .sv-tree a, .sv-tree .sv-node { text-decoration: none; }
.sv-node.sv-added rect { fill: #ddf4ff; stroke: #0969da; stroke-dasharray: 4 2; }
.sv-node.sv-root rect { fill: #eef1f4; }
.sv-edge { fill: none; stroke: #8c959f; } .sv-edge.sv-path { stroke: #2da44e; stroke-width: 2; }
.sv-edge.sv-unchecked { opacity: .38; } .sv-edge.sv-added { stroke: #0969da; stroke-dasharray: 4 2; }
.sv-tree-table .sv-row-path { background: #dafbe1; } .sv-tree-table .sv-row-rejected { background: #ffebe9; }
.sv-tree-table .sv-row-unchecked { color: #8c959f; }
.sv-node-card { display: none; margin: 6px 0; padding: 6px 10px; border: 2px solid #0969da; border-radius: 6px; }
.sv-node-card:target { display: block; }
"""


def highlight_css(step: int) -> str:
    """Marks the spans of one step in the token view (spans carry ``data-step``)."""
    return f'.sv-tok[data-step="{int(step)}"] {{ outline: 2px solid #cf222e; outline-offset: 1px; }}'


COL, ROW, BOX_W, BOX_H, PAD = 96, 24, 84, 20, 4
"""A tree drawing's column and row pitch, a node's box and the margin, in the SVG's units (pixels at its natural size)."""
DOT_R, TEXT_X, LABEL_CHARS = 6.5, 19, 6
"""A node's dot at probability 1 (its area is the probability), where its label starts, and the characters of token
text it shows (the full text is in its tooltip)."""


VERDICTS = {"path": "accepted", "rejected": "rejected", "unchecked": "not checked"}


def _state(node: Mapping, on_path: bool) -> str:
    return "path" if on_path else "rejected" if node["accepted"] is False else "unchecked"


def tree_svg(event: Mapping, pieces: Mapping[int, str]) -> str:
    """The step's tree as an inline SVG: depth left to right, siblings stacked (:func:`layout`), the target's own
    token as one more child of the path's end; each node's dot has the area of its q or, toggled, its p."""
    tree, step = event["tree"], event["step"]
    parents, path, nodes = tree["parents"], tree["accepted_path"], tree["nodes"]
    tail = event["emitted_ids"][len(path):]
    links = parents + [path[-1] if path else -1] * bool(tail)  # the target's own token: a child of the path's end
    states = [_state(node, i in path) for i, node in enumerate(nodes)] + ["added"] * bool(tail)
    places = layout(links)
    width = 2 * PAD + COL * max(d for d, _ in places.values()) + BOX_W
    height = 2 * PAD + ROW * max(r for _, r in places.values()) + BOX_H

    def xy(node: int) -> tuple[float, float]:
        depth, row = places[node]
        return PAD + depth * COL, PAD + row * ROW

    out = [f'<svg class="sv-tree" width="{width}" height="{height:g}" viewBox="0 0 {width} {height:g}" style="--sv-w: {width}px" '
           f'role="img" aria-label="token tree of step {step}">']
    for i, parent in enumerate(links):
        (x0, y0), (x1, y1) = xy(parent), xy(i)
        x0, mid, y0, y1 = x0 + BOX_W, x0 + BOX_W + (x1 - x0 - BOX_W) / 2, y0 + BOX_H / 2, y1 + BOX_H / 2
        out.append(f'<path class="sv-edge sv-{states[i]}" d="M{x0:g} {y0:g} C{mid:g} {y0:g} {mid:g} {y1:g} {x1:g} {y1:g}"/>')
    out.append(_box(*xy(-1), "root", "sv-root", "the committed text"))
    for i, node in enumerate(nodes):
        text, state = piece(pieces, node["token"]), states[i]
        tip = f"node {i}, {text}: p = {_f(node['p'])}, q = {_f(node['q'])}, u = {_f(node['u'])} ({VERDICTS[state]})"
        label = {"path": "✓ ", "rejected": "✗ ", "unchecked": ""}[state] + _short(text)
        out.append(f'<a href="#sv-node-{step}-{i}">' + _box(*xy(i), label, f"sv-{state}", tip, q=node["q"], p=node["p"]) + "</a>")
    if tail:
        text, p = piece(pieces, tail[0]), value_at(event.get("emitted_p"), len(path))
        out.append(_box(*xy(len(nodes)), "+ " + _short(text), "sv-added", f"{text}: the target's own token after the path, "
                        f"p = {_f(p)}", p=p))
    return "".join(out) + "</svg>"


def _short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _box(x: float, y: float, label: str, cls: str, tip: str, **dots: float | None) -> str:
    """A node: its box, a dot per probability in ``dots`` (``q``, ``p``; a dashed ring where there is none) and its label."""
    circles = "".join(f'<circle class="sv-dot sv-enc-{name}{" sv-dot-none" * (v is None)}" cx="{x + TEXT_X / 2:g}" '
                    f'cy="{y + BOX_H / 2:g}" r="{3 if v is None else max(1.0, DOT_R * v ** .5):.2f}"/>' for name, v in dots.items())
    return (f'<g class="sv-node {cls}"><title>{html.escape(tip)}</title><rect x="{x:g}" y="{y:g}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="5"/>{circles}<text x="{x + TEXT_X:g}" y="{y + 14.5:g}">{html.escape(label)}</text></g>')


TREE_KEY = ('<label class="sv-tree-toggle"><input type="checkbox" class="sv-enc-toggle"> dots show p (the target) instead of q '
            '(the draft)</label> <span class="sv-tree-key"><span class="sv-enc-q">A node\'s dot has the area of q, the draft\'s '
            'probability of its token.</span><span class="sv-enc-p">A node\'s dot has the area of p, the target\'s probability of '
            'its token where it was checked; a dashed ring: never checked.</span></span>')
"""The drawing's toggle and key: switched by CSS alone, so it works without a server (the offline page too)."""


def tree_microscope(event: Mapping, pieces: Mapping[int, str]) -> str:
    """The tree, one row per node (parent, depth, p and q at the stage it was checked, u, verdict) and one card per
    node, shown when its node or row is clicked (:func:`node_card`)."""
    tree, step = event["tree"], event["step"]
    path = tree["accepted_path"]
    rows = []
    for i, node in enumerate(tree["nodes"]):
        state = _state(node, i in path)
        rows.append(f'<tr class="sv-row-{state}"><td><a href="#sv-node-{step}-{i}">{i}</a></td><td><code>'
                    f'{html.escape(piece(pieces, node["token"]))}</code></td><td>{node["parent"]}</td><td>{node["depth"]}</td>'
                    f'<td>{_f(node["p"])}</td><td>{_f(node["q"])}</td><td>{_f(node["u"])}</td><td>{VERDICTS[state]}</td></tr>')
    head = ('<table class="sv-mic-levels sv-tree-table"><tr><th>node</th><th>token</th><th>parent</th><th>depth</th><th>p</th>'
            "<th>q</th><th>u</th><th>verdict</th></tr>")
    cards = "".join(node_card(event, pieces, i) for i in range(len(tree["nodes"])))
    return (f'<div class="sv-mic"><p class="sv-mic-title">Step {step}: a {tree["kind"]} tree of {len(tree["nodes"])} nodes, '
            f'verified in one target forward; click a node for its microscope</p><div class="sv-tree-view">{TREE_KEY}'
            f'<div class="sv-tree-box">{tree_svg(event, pieces)}</div></div>{cards}{head}' + "".join(rows) + "</table></div>")


def node_card(event: Mapping, pieces: Mapping[int, str], i: int) -> str:
    """Node ``i`` under the microscope: the branch it continues, how it was drawn, and the test that decided it (greedy:
    is it the target's argmax; sampling: u · q < p, with p corrected for the siblings rejected before it), or why it
    was never checked; then its children."""
    tree, step = event["tree"], event["step"]
    parents, path, nodes = tree["parents"], tree["accepted_path"], tree["nodes"]
    node, state = nodes[i], _state(nodes[i], i in path)
    above, up = [], node["parent"]
    while up >= 0:
        above.append(up)
        up = parents[up]
    token = html.escape(piece(pieces, node["token"]))
    context = " ".join(["the committed text", *(piece(pieces, nodes[j]["token"]) for j in reversed(above))])
    before = [j for j in range(i) if parents[j] == node["parent"]]
    drawn = (f"q = {_f(node['q'])}, drawn without replacement after its sibling{'s' * (len(before) > 1)} "
             f"{', '.join(piece(pieces, nodes[j]['token']) for j in before)} (q without them, renormalised)"
             if before else f"q = {_f(node['q'])}, the first child drawn here")
    lines = [f"Drafted after: {html.escape(context)}.", html.escape(f"Depth {node['depth']}; {drawn}.")]
    if node["accepted"] is None:
        passed = next((j for j in before if nodes[j]["accepted"]), None)
        if ended_at_stop(event) and path and path[-1] in above:
            why = f"the output ended at the stop token {piece(pieces, nodes[path[-1]]['token'])} above it"
        elif passed is not None:
            why = f"an earlier sibling, {piece(pieces, nodes[passed]['token'])}, passed first"
        else:
            why = "its parent was not accepted, so nothing below it is checked"
        lines.append(html.escape(f"Never checked: {why}."))
    elif node["u"] is None:
        won = next((j for j in range(len(nodes)) if parents[j] == node["parent"] and j in path), None)
        argmax = (piece(pieces, nodes[won]["token"]) if won is not None else
                  piece(pieces, event["emitted_ids"][len(path)]) if len(event["emitted_ids"]) > len(path) else "?")
        verdict = "it is, so it is accepted" if node["accepted"] else f"it is not (the argmax is {argmax}): rejected"
        lines.append(html.escape(f"Greedy: p = {_f(node['p'])}; accepted iff the draft is the target's argmax here: {verdict}."))
    else:
        ratio = node["p"] / node["q"] if node["q"] else float("inf")
        rejected = [piece(pieces, nodes[j]["token"]) for j in before if nodes[j]["accepted"] is False]
        corrected = f", after the residual updates of {', '.join(rejected)}" if rejected else ""
        verdict = "accepted" if node["accepted"] else "rejected: p moves to norm(max(p − q, 0)) for the next sibling"
        lines.append(html.escape(f"Sampling: p = {_f(node['p'])}{corrected}; u = {_f(node['u'])} against p/q = {_f(ratio)}: "
                                 f"u {'<' if node['accepted'] else '≥'} p/q, {verdict}."))
    kids = [j for j in range(len(nodes)) if parents[j] == i]
    if kids:
        lines.append(html.escape("Its children: " + ", ".join(f"{piece(pieces, nodes[j]['token'])} "
                                                              f"({VERDICTS[_state(nodes[j], j in path)]})" for j in kids) + "."))
    return (f'<div class="sv-node-card sv-row-{state}" id="sv-node-{step}-{i}"><p class="sv-mic-title">Node {i}: '
            f'<code>{token}</code>, {VERDICTS[state]}</p>' + "".join(f"<div>{line}</div>" for line in lines) + "</div>")


def tree_narration(event: Mapping, pieces: Mapping[int, str]) -> str:
    """Which branch won and why, in plain words."""
    tree = event["tree"]
    path, nodes, parents = tree["accepted_path"], tree["nodes"], tree["parents"]
    roots = sum(p < 0 for p in parents)
    depth = max((n["depth"] for n in nodes), default=0)
    words = [f"{event['drafter']} drafted a {tree['kind']} tree of {len(nodes)} tokens, {roots} at the root and {depth} deep; "
             "the target scored every node in one forward, each node seeing only its own ancestors."]
    greedy = all(n["u"] is None for n in nodes)
    rejected = [i for i, n in enumerate(nodes) if n["accepted"] is False]
    if path:
        branch = " ".join(piece(pieces, nodes[i]["token"]) for i in path)
        why = ("each is the target's most likely token after the ones before it" if greedy else
               "at each level the first child whose test passed (u < p/q, p corrected for the siblings rejected before it)")
        words.append(f"The branch {branch} won: {why}.")
    else:
        words.append("No root child passed: " + ("none is the target's most likely token." if greedy else
                                                    "every one failed its test, each rejection moving p to norm(max(p − q, 0))."))
    if rejected:
        words.append(f"{len(rejected)} sibling{'s' * (len(rejected) > 1)} on the way {'were' if len(rejected) > 1 else 'was'} "
                     f"rejected ({', '.join(piece(pieces, nodes[i]['token']) for i in rejected[:6])}); "
                     f"{sum(n['accepted'] is None for n in nodes)} nodes below them were never checked.")
    tail = event["emitted_ids"][len(path):]
    if tail:
        words.append(f"The target then added {piece(pieces, tail[0])} after the branch.")
    elif ended_at_stop(event):
        words.append(stop_words(event["emitted_ids"][-1], pieces) + " Nothing below it was checked.")
    return " ".join(words)
