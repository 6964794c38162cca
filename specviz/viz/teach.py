"""Teaching views of one step: a narration in plain words and the verification microscope.

Both read a step as recorded (a StepEvent's dict, live or from a trace file) and a map from token id to its text,
so they work the same for a live run, a finished run and a loaded trace with no model. The microscope shows, per
verified position, p and q over their top tokens, min(1, p/q) with the uniform draw u that decided it, the residual
distribution at a rejection, the judge score against δ, and a chain's per-level blocks. A step that drafted a token
tree is drawn as that tree (nodes are tokens; the accepted path highlighted, rejected siblings marked, nodes never
checked dimmed; each node opens its own microscope card: the context it was drafted after, q at its stage, p after
the siblings rejected before it, u and the test that decided it, or why it was never checked), and its narration
says which branch won and why.
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
    if event.get("tree") and drafts:
        words.append(tree_narration(event, pieces))
    elif not drafts:
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
.sv-tree-box { overflow-x: auto; } .sv-tree { display: block; margin: 6px 0; font: 12px ui-monospace, monospace; }
.sv-node rect { fill: #fff; stroke: #8c959f; stroke-width: 1.2; }
.sv-node.sv-path rect { fill: #dafbe1; stroke: #2da44e; stroke-width: 2; }
.sv-node.sv-rejected rect { fill: #ffebe9; stroke: #cf222e; }
.sv-node.sv-unchecked { opacity: .38; }
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


COL, ROW, BOX_W, BOX_H = 118, 30, 104, 22
"""A tree drawing's column and row pitch and a node's box, in pixels."""


def layout(parents: list[int]) -> dict[int, tuple[int, float]]:
    """(depth, row) of the root (key −1) and every node: depth as the column, rows so that a parent sits level with its
    first child and subtrees never overlap."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        kids.setdefault(parent, []).append(i)
    place: dict[int, tuple[int, float]] = {}  # −1: the root
    next_row = [0.0]

    def visit(node: int, depth: int) -> float:
        below = [visit(c, depth + 1) for c in kids.get(node, [])]
        row = below[0] if below else next_row[0]
        if not below:
            next_row[0] += 1
        place[node] = (depth, row)
        return row

    visit(-1, 0)
    return place


VERDICTS = {"path": "accepted", "rejected": "rejected", "unchecked": "not checked"}


def _state(node: Mapping, on_path: bool) -> str:
    return "path" if on_path else "rejected" if node["accepted"] is False else "unchecked"


def tree_svg(event: Mapping, pieces: Mapping[int, str]) -> str:
    """The step's tree as an inline SVG (see the module docstring)."""
    tree, step = event["tree"], event["step"]
    parents, path, nodes = tree["parents"], tree["accepted_path"], tree["nodes"]
    places = layout(parents)
    rows = max(r for _, r in places.values()) + 1
    depth = max(d for d, _ in places.values())
    tail = event["emitted_ids"][len(path):]
    width, height = COL * (depth + 2) + 8, ROW * (rows + 1) + 8

    def xy(d: int, r: float) -> tuple[float, float]:
        return 4 + d * COL, 4 + r * ROW

    out = [f'<svg class="sv-tree" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="token tree of step {step}">']
    for i, parent in enumerate(parents):
        (x0, y0), (x1, y1) = xy(*places[parent]), xy(*places[i])
        out.append(f'<path class="sv-edge sv-{_state(nodes[i], i in path)}" d="M{x0 + BOX_W} {y0 + BOX_H / 2} '
                   f'C{x0 + BOX_W + 8} {y0 + BOX_H / 2} {x1 - 8} {y1 + BOX_H / 2} {x1} {y1 + BOX_H / 2}"/>')
    out.append(_box(*xy(*places[-1]), "root", "sv-root", "the committed text"))
    for i, node in enumerate(nodes):
        d, r = places[i]
        state = _state(node, i in path)
        mark = {"path": "✓ ", "rejected": "✗ ", "unchecked": ""}[state]
        tip = f"node {i}: p = {_f(node['p'])}, q = {_f(node['q'])}, u = {_f(node['u'])} ({state})"
        out.append(f'<a href="#sv-node-{step}-{i}">' + _box(*xy(d, r), mark + piece(pieces, node["token"]), f"sv-{state}", tip) + "</a>")
    if tail:  # in a row of its own below the tree, after the path's last node
        (x0, y0), (x1, y1) = xy(*places[path[-1] if path else -1]), xy(len(path) + 1, rows)
        out.append(f'<path class="sv-edge sv-added" d="M{x0 + BOX_W / 2} {y0 + BOX_H} C{x0 + BOX_W / 2} {y1 + BOX_H / 2} '
                   f'{x1 - 20} {y1 + BOX_H / 2} {x1} {y1 + BOX_H / 2}"/>')
        out.append(_box(x1, y1, "+ " + piece(pieces, tail[0]), "sv-added", "the target's own token after the path"))
    return "".join(out) + "</svg>"


def _box(x: float, y: float, label: str, cls: str, tip: str) -> str:
    return (f'<g class="sv-node {cls}"><title>{html.escape(tip)}</title><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" '
            f'rx="5"/><text x="{x + 6}" y="{y + 15}">{html.escape(label[:14])}</text></g>')


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
            f'verified in one target forward; click a node for its microscope</p><div class="sv-tree-box">'
            f'{tree_svg(event, pieces)}</div>{cards}{head}' + "".join(rows) + "</table></div>")


def node_card(event: Mapping, pieces: Mapping[int, str], i: int) -> str:
    """Node ``i`` under the microscope: the branch it continues, how it was drawn, and the test that decided it (greedy:
    is it the target's argmax; sampling: u · q < p, with p corrected for the siblings rejected before it), or why it
    was never checked; then its children."""
    tree, step = event["tree"], event["step"]
    parents, path, nodes = tree["parents"], tree["accepted_path"], tree["nodes"]
    node, state = nodes[i], _state(nodes[i], i in path)
    chain, up = [], node["parent"]
    while up >= 0:
        chain.append(piece(pieces, nodes[up]["token"]))
        up = parents[up]
    token = html.escape(piece(pieces, node["token"]))
    context = " ".join(["the committed text", *reversed(chain)])
    before = [j for j in range(i) if parents[j] == node["parent"]]
    drawn = (f"q = {_f(node['q'])}, drawn without replacement after its sibling{'s' * (len(before) > 1)} "
             f"{', '.join(piece(pieces, nodes[j]['token']) for j in before)} (q without them, renormalised)"
             if before else f"q = {_f(node['q'])}, the first child drawn here")
    lines = [f"Drafted after: {html.escape(context)}.", html.escape(f"Depth {node['depth']}; {drawn}.")]
    if node["accepted"] is None:
        passed = next((j for j in before if nodes[j]["accepted"]), None)
        why = (f"an earlier sibling, {piece(pieces, nodes[passed]['token'])}, passed first" if passed is not None else
               "its parent was not accepted, so nothing below it is checked")
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
    return " ".join(words)
