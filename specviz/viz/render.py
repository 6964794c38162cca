"""HTML for the token view, its legend, status lines and headline numbers.

Pure functions over plain data: every piece of model or user text goes through :func:`html.escape`.
Token kinds are told apart by a non-colour cue (underline style, strike-through, box, marker) first;
colour only reinforces it, so the view reads in greyscale and for colour-blind users.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenStyle:
    """How one kind of token looks: legend words, the non-colour cue (CSS and words) and a colour."""

    label: str
    cue: str
    css: str
    colour: str


STYLES: dict[str, TokenStyle] = {
    "accepted": TokenStyle("accepted draft", "solid underline", "text-decoration: underline solid 2px", "#d7f5dd"),
    "judge": TokenStyle("accepted by the judge", "wavy underline", "text-decoration: underline wavy 1.5px", "#ead9fb"),
    "relaxed": TokenStyle("accepted by lenience / top-k", "dashed underline", "text-decoration: underline dashed 2px", "#d5f1f1"),
    "correction": TokenStyle("target's correction (replaces a rejected draft)", "solid box, bold",
                             "border: 1.5px solid currentColor; font-weight: 700", "#fde2c4"),
    "bonus": TokenStyle("bonus token (every draft accepted)", "dashed box, bold, ⁺ mark",
                        "border: 1.5px dashed currentColor; font-weight: 700", "#d6e6fb"),
    "target": TokenStyle("target token, nothing drafted (autoregressive step)", "plain, no mark", "", "#eceff3"),
    "rejected": TokenStyle("rejected draft, shown where it was proposed", "struck through, italic",
                           "text-decoration: line-through solid 2px; font-style: italic; opacity: .8", "#fbd3d3"),
    "unchecked": TokenStyle("draft after a rejection (never checked)", "dotted strike-through, italic, faint",
                            "text-decoration: line-through dotted 2px; font-style: italic; opacity: .55", "#f1f1f1"),
}

MARKERS = {"bonus": "⁺"}
"""Text appended after a token of that kind (through CSS ``::after``, so it is not part of copied text)."""

REASON_SYMBOLS = {"exact": "✓", "judge": "J", "lenient": "L", "topk": "K", "rejected": "✗", "unchecked": "·"}
REASON_LEGEND = "✓ exact · J judge · L lenient · K top-k · ✗ rejected · · unchecked"

_CONTROL = {c: chr(0x2400 + c) for c in range(32) if c not in (9, 10)} | {127: "␡"}


@dataclass(frozen=True)
class TokenSpan:
    """One token as the viewer shows it (``kind`` is a key of :data:`STYLES`)."""

    text: str
    kind: str
    step: int
    token_id: int | None = None
    p: float | None = None
    q: float | None = None
    judge: float | None = None


def token_css() -> str:
    """CSS rules of the token view (one rule per kind, generated from :data:`STYLES`)."""
    rules = [
        ".sv-tokens { white-space: pre-wrap; word-break: break-word; line-height: 1.9; font-size: 15px; }",
        ".sv-tok { border-radius: 3px; padding: 0 1px; margin: 0 0.5px; color: #1b1f24; text-underline-offset: 3px; }",
        ".sv-nl { opacity: .45; font-size: .8em; }",
    ]
    for kind, style in STYLES.items():
        rules.append(f".sv-{kind} {{ background: {style.colour}; {style.css} }}")
    for kind, mark in MARKERS.items():
        rules.append(f'.sv-{kind}::after {{ content: "{mark}"; font-size: .75em; vertical-align: super; }}')
    return "\n".join(rules)


def visible_text(text: str) -> str:
    """Escaped token text with newlines shown (↵ then a real break) and control characters made visible."""
    if text == "":
        return '<span class="sv-nl">∅</span>'
    shown = html.escape(text.translate(_CONTROL), quote=False)
    return shown.replace("\n", '<span class="sv-nl">↵</span>\n')


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def tooltip(span: TokenSpan) -> str:
    """Hover text: step, kind, the token, p (target), q (draft) and the judge score."""
    token = repr(span.text) + (f" (id {span.token_id})" if span.token_id is not None else "")
    return (f"step {span.step} · {STYLES[span.kind].label} · {token} · p={_num(span.p)} · q={_num(span.q)} · "
            f"judge={_num(span.judge, 2)}")


def span_html(span: TokenSpan) -> str:
    title = html.escape(tooltip(span), quote=True)
    return (f'<span class="sv-tok sv-{span.kind}" data-step="{int(span.step)}" data-kind="{span.kind}" title="{title}">'
            f'{visible_text(span.text)}</span>')


def spans_html(spans: Iterable[TokenSpan]) -> str:
    """The spans' HTML, concatenated: appending spans only ever appends to this string (cheap streaming)."""
    return "".join(span_html(s) for s in spans)


def legend_html(kinds: Sequence[str] | None = None) -> str:
    """A legend with a sample of every token style and its non-colour cue in words."""
    items = []
    for kind in kinds or STYLES:
        style = STYLES[kind]
        sample = span_html(TokenSpan("token", kind, 0))
        items.append(f'<span class="sv-legend-item">{sample} {html.escape(style.label)} '
                     f'<span class="sv-cue">({html.escape(style.cue)})</span></span>')
    return '<div class="sv-legend sv-tokens">' + "".join(items) + "</div>"


LEVEL_ICONS = {"info": "ℹ", "busy": "⏳", "ok": "✔", "warn": "⚠", "error": "⚠", "stopped": "⏹"}


def status_html(message: str, level: str = "info") -> str:
    """A one-line status box; errors and warnings carry an icon and a role so they are announced."""
    role = ' role="alert"' if level in ("error", "warn") else ' role="status"'
    icon = LEVEL_ICONS.get(level, "ℹ")
    return f'<div class="sv-status sv-status-{level}"{role}><b>{icon}</b> {html.escape(message)}</div>'


@dataclass(frozen=True)
class Headline:
    """Big numbers above the charts; ``None`` means 'not measured (yet)'."""

    speedup: float | None
    tokens_per_s: float | None
    ar_tokens_per_s: float | None
    mean_accept_len: float | None
    accept_rate: float | None
    new_tokens: int
    wall_s: float
    baseline_note: str = ""
    transformers: Mapping | None = None
    """transformers' ``generate`` on the AR baseline's settings (see :func:`generate_card`); None: not asked for."""


def _card(value: str, label: str, hint: str = "") -> str:
    hint_html = f'<div class="sv-card-hint">{html.escape(hint)}</div>' if hint else ""
    return (f'<div class="sv-card"><div class="sv-card-value">{html.escape(value)}</div>'
            f'<div class="sv-card-label">{html.escape(label)}</div>{hint_html}</div>')


SAME_SPEED = 0.02
"""Speed ratios within this of 1 read as the same speed: closer than run-to-run timing noise."""


def speed_verdict(ratio: float, of: str = "AR") -> str:
    """What a speed ratio to ``of`` says, in words."""
    if abs(ratio - 1) < SAME_SPEED:
        return f"as fast as {of}"
    return f"faster than {of}" if ratio > 1 else f"slower than {of}"


GENERATE = "transformers' generate"


def generate_card(tokens_per_s: float | None, generate: Mapping) -> str:
    """The card of the speedup over transformers' ``generate`` (timed on transformers' stock kernels). ``generate``
    holds its ``tokens_per_s`` and ``same_tokens_as_ar`` (None when sampled: draws are not comparable token for token);
    or an ``error``; or, before it is measured, only a ``note``."""
    if generate.get("error"):
        return _card("–", f"speedup vs {GENERATE}", f"not measured: {generate['error']}")
    peer = generate.get("tokens_per_s")
    if not peer or tokens_per_s is None:
        return _card("…", f"speedup vs {GENERATE}", generate.get("note") or f"{GENERATE} not timed yet")
    ratio = tokens_per_s / peer
    same = generate.get("same_tokens_as_ar")
    tokens = "sampled: tokens not comparable" if same is None else f"same tokens as AR: {'yes' if same else 'no'}"
    return _card(f"{ratio:.2f}×", f"speedup vs {GENERATE}",
                 f"{speed_verdict(ratio, 'generate')}: generate {peer:.1f} tok/s, stock kernels; {tokens}")


def headline_html(h: Headline) -> str:
    """Speedup vs AR (and vs transformers' generate, when timed), tokens/s, mean accepted length and acceptance rate
    as cards."""
    if h.speedup is None:
        speed = _card("…", "speedup vs AR", h.baseline_note or "AR baseline not measured yet")
    else:
        speed = _card(f"{h.speedup:.2f}×", f"speedup vs AR ({speed_verdict(h.speedup)})", h.baseline_note)
    ar = f"AR {h.ar_tokens_per_s:.1f} tok/s" if h.ar_tokens_per_s else ""
    cards = [
        speed,
        *([generate_card(h.tokens_per_s, h.transformers)] if h.transformers is not None else []),
        _card(f"{h.tokens_per_s:.1f}" if h.tokens_per_s is not None else "…", "tokens / s", ar),
        _card(f"{h.mean_accept_len:.2f}" if h.mean_accept_len is not None else "–", "mean accepted length",
              "tokens per target forward"),
        _card(f"{100 * h.accept_rate:.0f}%" if h.accept_rate is not None else "–", "acceptance rate",
              "accepted / drafted tokens"),
        _card(str(h.new_tokens), "new tokens", f"{h.wall_s:.2f} s wall time incl. prefill"),
    ]
    return '<div class="sv-cards">' + "".join(cards) + "</div>"


def column_html(title: str, subtitle: str, body: str) -> str:
    """One column of the comparison view (``body`` is already-rendered span HTML)."""
    return (f'<div class="sv-col"><div class="sv-col-head"><b>{html.escape(title)}</b>'
            f'<div class="sv-col-sub">{html.escape(subtitle)}</div></div>'
            f'<div class="sv-col-body sv-tokens">{body}</div></div>')


def columns_html(columns: Sequence[str]) -> str:
    return f'<div class="sv-cols" style="--sv-ncols: {max(1, len(columns))}">' + "".join(columns) + "</div>"


def serving_html(serving: Mapping | None) -> str:
    """A run's speculation as a serving engine takes it (a trace's ``serving``): vLLM's ``--speculative-config`` and
    SGLang's flags, ready to copy, or why neither engine can run it."""
    if not serving:
        return status_html("No export: this run came from a server, or its trace was written before runs kept one.", "info")
    if "unsupported" in serving:
        return status_html(f"Not servable by vLLM or SGLang as it is: {serving['unsupported']}.", "info")
    vllm, sglang = json.dumps(serving["vllm_speculative_config"]), " ".join(serving["sglang_args"])
    return ('<div class="sv-serving"><b>Serve this run\'s speculation</b>'
            f"<div>vLLM: <code>--speculative-config '{html.escape(vllm)}'</code></div>"
            f"<div>SGLang: <code>{html.escape(sglang)}</code></div></div>")

