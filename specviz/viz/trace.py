"""From the engine's StepEvents to what the UI shows: token spans (with their text in context), step rows and a token
tree's layout.

Built incrementally: each event is turned into spans and a table row once, so streaming a long run costs
the same per step at the end as at the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specviz.core.record import SPANS
from specviz.viz.render import REASON_SYMBOLS, TokenSpan

ACCEPT_KINDS = {"exact": "accepted", "judge": "judge", "lenient": "relaxed", "topk": "relaxed"}
CONTEXT = 4
"""Tokens of left context used to decode a token's text (leading spaces and split bytes need it)."""

STEP_COLUMNS = ["step", "drafter", "γ", "accepted / drafted", "reasons", "emitted", "text", *(f"{k} ms" for k in SPANS),
                "total ms", "elapsed s", "why"]


def _get(event: Any, name: str) -> Any:
    return event[name] if isinstance(event, dict) else getattr(event, name)


class PieceDecoder:
    """Text of one token given the tokens before it (the difference of two short decodes)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def piece(self, context: Sequence[int], token: int) -> str:
        ctx = list(context[-CONTEXT:])
        before, after = self._decode(ctx), self._decode(ctx + [token])
        common = 0
        for a, b in zip(before, after):
            if a != b:
                break
            common += 1
        return after[common:] if common == len(before) else self._decode([token])


@dataclass
class TraceBuilder:
    """Accumulates the spans and step rows of one run."""

    tokenizer: Any
    prompt_ids: Sequence[int]
    spans: list[TokenSpan] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.decoder = PieceDecoder(self.tokenizer)
        self.committed = list(self.prompt_ids[-CONTEXT:])
        self.new_tokens = 0

    def add(self, event: Any) -> list[TokenSpan]:
        """Record one StepEvent (or its dict); returns the spans it added."""
        record = event if isinstance(event, dict) else event.to_dict()
        self.events.append(record)
        spans = step_spans(record, self.committed, self.decoder)
        self.committed = (self.committed + list(record["emitted_ids"]))[-CONTEXT:]
        self.new_tokens += len(record["emitted_ids"])
        self.spans.extend(spans)
        self.rows.append(step_row(record, spans))
        return spans

    def add_all(self, events: Sequence[Any]) -> list[TokenSpan]:
        return [s for e in events for s in self.add(e)]


def value_at(values: Sequence[float] | None, i: int) -> float | None:
    """values[i], or None where there is no such value (a list left out, or too short)."""
    return values[i] if values is not None and i < len(values) else None


def step_spans(event: dict, context: Sequence[int], decoder: PieceDecoder) -> list[TokenSpan]:
    """Spans of one step: accepted drafts, then rejected / unchecked drafts where they were proposed,
    then the target's own token (correction, bonus, or a plain target token when nothing was drafted); a draft whose id
    the server did not tell (``None``) reads as ``?``. A tree step
    reads as its accepted path and the first child rejected below it. A step that ended at a stop token among its
    drafts (it emitted no more tokens than it accepted) ends there."""
    event = along_path(event) if event.get("tree") else event
    drafts, emitted = list(event["draft_ids"]), list(event["emitted_ids"])
    accepted, step = int(event["accepted"]), int(event["step"])
    reasons, scores = list(event.get("accept_reasons") or []), event.get("judge_scores")
    if ended_at_stop(event):
        drafts = drafts[: len(emitted)]
    ctx, spans = list(context), []
    for i, tok in enumerate(drafts):
        reason = reasons[i] if i < len(reasons) else ("exact" if i < accepted else "unchecked")
        if i < accepted:
            kind = ACCEPT_KINDS.get(reason, "accepted")
        else:
            kind = "rejected" if i == accepted else "unchecked"
        if tok is None:  # a server does not say which tokens it rejected
            spans.append(TokenSpan("?", kind, step))
            continue
        text = decoder.piece(ctx, tok)
        spans.append(TokenSpan(text, kind, step, tok, value_at(event.get("draft_p"), i), value_at(event.get("draft_q"), i),
                               value_at(scores, i)))
        ctx.append(tok)
    if len(emitted) > accepted:
        tok = emitted[accepted]
        kind = "target" if not drafts else ("correction" if accepted < len(drafts) else "bonus")
        base = list(context) + emitted[:accepted]
        spans.append(TokenSpan(decoder.piece(base, tok), kind, step, tok, value_at(event.get("emitted_p"), accepted)))
    return spans


def ended_at_stop(event: Mapping) -> bool:
    """Whether the step ended at a stop token among its accepted drafts: it emitted no token of the target's own."""
    return len(event["emitted_ids"]) <= event["accepted"]


def along_path(event: dict) -> dict:
    """A tree step as a chain: the accepted path's nodes, then the first rejected child of its last node (if any)."""
    tree = event["tree"]
    path, parents = tree["accepted_path"], tree["parents"]
    end = path[-1] if path else -1
    rejected = [i for i, n in enumerate(tree["nodes"]) if parents[i] == end and n["accepted"] is False][:1]
    nodes = path + rejected
    pick = {name: [event[name][i] for i in nodes] for name in ("draft_ids", "draft_p", "draft_q", "accept_reasons")}
    return {**event, **pick, "judge_scores": None}


def reasons_text(reasons: Sequence[str]) -> str:
    return "".join(REASON_SYMBOLS.get(r, r[:1].upper()) for r in reasons)


def _why_text(why: dict | None) -> str:
    """The policy's and the selector's reasons, each in its own part."""
    parts = [", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in reasons.items())
             for reasons in (why or {}).values() if reasons]
    return " | ".join(parts)


def step_row(event: dict, spans: Sequence[TokenSpan]) -> list:
    """One row of the step table (see :data:`STEP_COLUMNS`)."""
    kept = "".join(s.text for s in spans if s.kind not in ("rejected", "unchecked"))
    return [
        event["step"], event["drafter"], event["gamma"], f"{event['accepted']} / {len(event['draft_ids'])}",
        reasons_text(event.get("accept_reasons") or []), len(event["emitted_ids"]), kept.replace("\n", "↵"),
        *(round(event["spans"][k], 2) for k in SPANS), round(event["total_ms"], 2), round(event["elapsed_ms"] / 1e3, 3),
        _why_text(event.get("why")),
    ]


def cumulative(events: Sequence[Any]) -> tuple[list[float], list[int]]:
    """(seconds since start, tokens so far) after every step, starting at (0, 0)."""
    times, tokens, total = [0.0], [0], 0
    for e in events:
        total += len(_get(e, "emitted_ids"))
        times.append(_get(e, "elapsed_ms") / 1e3)
        tokens.append(total)
    return times, tokens


def until(events: Sequence[dict], seconds: float) -> list[dict]:
    """The events finished by ``seconds`` after the start (for the synchronised replay)."""
    return [e for e in events if e["elapsed_ms"] / 1e3 <= seconds + 1e-9]


def layout(parents: list[int]) -> dict[int, tuple[int, float]]:
    """(depth, row) of the root (key −1) and every node, as a tidy tree: depth as the column, the leaves on consecutive
    rows (siblings in draw order), and every other node level with the middle of its subtree's rows."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        kids.setdefault(parent, []).append(i)
    place: dict[int, tuple[int, float]] = {}  # −1: the root
    leaves = 0

    def visit(node: int, depth: int) -> tuple[float, float]:
        """Places the subtree of ``node``; returns its first and last row."""
        nonlocal leaves
        spans = [visit(c, depth + 1) for c in kids.get(node, [])]
        if spans:
            first, last = spans[0][0], spans[-1][1]
        else:
            first = last = leaves
            leaves += 1
        place[node] = (depth, (first + last) / 2)
        return first, last

    visit(-1, 0)
    return place
