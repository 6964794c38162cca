"""The recorder: turns what a step computed (the draft, the target's p, the verdict and the evidence it read, the
step's :class:`~specviz.core.policy.Outcome`, its stopwatch marks) into the typed records of its
:class:`~specviz.core.record.StepEvent`, one :class:`~specviz.core.record.NodeRecord` per drafted node whatever the
shape.

Without ``full`` recording (benchmarks) a step leaves out what only the views read (p and q of each token, the node
records), and the recorder reads nothing from the device. With it, those reads come after the step's last timing
mark, so they never count as the step's time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.core.acceptance import UNCHECKED, Evidence, Verdict
from specviz.core.drafters import Draft
from specviz.core.policy import Outcome
from specviz.core.record import LevelRecord, NodeRecord, Scores, StepEvent, TreeRecord, accept_probability
from specviz.core.sampling import Sampler
from specviz.core.timing import Mark, Stopwatch
from specviz.core.tree import TreeShape, depths

TOP_K = 10
"""Alternatives recorded per verified position: the k most likely tokens of p, of q and of the residual."""

@dataclass(frozen=True)
class StepMarks:
    """A step's stopwatch marks in order: its start, the decision (selector and policy), the draft, the verdict (the
    target's forward and the acceptance test, whose decision the host read), the commit, and the end of the policies'
    learning from the outcome (which counts as deciding)."""

    start: Mark
    decided: Mark
    drafted: Mark
    verified: Mark
    committed: Mark
    learned: Mark


def span_ms(watch: Stopwatch, start: Mark, end: Mark) -> float:
    return 1e3 * watch.seconds(start, end)


class Recorder:
    """Builds a decode's StepEvents from the stopwatch and what each step computed; with ``full``, what the views read
    (the target's p under ``sampler``'s transform among it)."""

    def __init__(self, watch: Stopwatch, start: Mark, sampler: Sampler, full: bool = True):
        self.watch, self.start, self.sampler, self.full = watch, start, sampler, full

    def step(self, step: int, outcome: Outcome, draft: Draft, gamma: int, logits: torch.Tensor, verdict: Verdict,
             emitted: list[int], marks: StepMarks, forward_ms: float, why: Callable[[], dict], shape: TreeShape) -> StepEvent:
        """The StepEvent of a step whose policy chose ``gamma`` (a tree: its node budget), drafted ``draft`` under
        ``shape``, scored it to ``logits``, decided ``verdict`` and emitted ``emitted``; ``why()`` builds its reasons
        (only here, and only with ``full``). Its spans are read from ``marks`` and, for recording, from this call's own
        end. The record ends where the output does: at a stop token among the accepted drafts, the drafts below it read
        as never checked."""
        p = self.sampler.probs(logits) if self.full else None
        path, below = verdict.path[: len(emitted)], stopped_below(verdict, draft, len(emitted))
        reasons = [UNCHECKED if i in below else kept for i, kept in enumerate(verdict.reasons)]
        full, ev = self.full, verdict.evidence
        rows = [0] + [i + 1 for i in path]
        views = dict(draft_q=draft.q_of_ids() if full else [],
                     draft_p=probs_at(p, draft.ids, [parent + 1 for parent in draft.parents]) if full else [],
                     emitted_p=probs_at(p, emitted, rows[: len(emitted)]) if full else [],
                     scores=scores_of(ev) if full else None, why=why() if full else None,
                     levels=[LevelRecord.of(work) for work in draft.levels],
                     nodes=node_records(draft, verdict, p, reasons, below, len(emitted)) if full else [])
        end, w, m = self.watch.mark(), self.watch, marks
        spans = {"deciding": span_ms(w, m.start, m.decided) + span_ms(w, m.committed, m.learned),
                 "drafting": span_ms(w, m.decided, m.drafted), "verifying": span_ms(w, m.drafted, m.verified),
                 "committing": span_ms(w, m.verified, m.committed), "recording": span_ms(w, m.learned, end)}
        return StepEvent(step=step, drafter=draft.drafter, gamma=gamma, drafted=len(draft.ids), draft_ids=[int(t) for t in draft.ids],
                         accepted=outcome.accepted, emitted_ids=emitted, accept_reasons=reasons, spans=spans,
                         total_ms=span_ms(w, m.start, end), forward_ms=forward_ms, elapsed_ms=span_ms(w, self.start, end),
                         tree=TreeRecord(shape.kind, shape.branch, draft.parents, path), **views)


def stopped_below(verdict: Verdict, draft: Draft, emitted: int) -> set[int]:
    """The drafts a stop token among the accepted ones cut off (a single path's later positions, a tree's stop node's
    subtree): a step that emitted no more tokens than its accepted drafts ended there. Empty for any other step."""
    if emitted > verdict.accepted:
        return set()
    stop, below = verdict.path[emitted - 1], set()
    for i, parent in enumerate(draft.parents):  # parents come before their children
        if parent == stop or parent in below:
            below.add(i)
    return below


def scores_of(evidence: Evidence | None) -> Scores | None:
    """The scoring rule's criterion the decision read, if it scored."""
    if evidence is None or evidence.relaxed.scores is None:
        return None
    return Scores(evidence.relaxed.scores.tolist(), evidence.relaxed.threshold)


def node_records(draft: Draft, verdict: Verdict, p: torch.Tensor, reasons: list[str], below: set[int],
                 emitted: int) -> list[NodeRecord]:
    """One :class:`NodeRecord` per drafted node, whatever the shape, from what the decision read (its evidence) and the
    target's ``p`` of the step; the nodes in ``below`` read as never checked, and only checked nodes carry the top
    tokens. Reading these changes nothing the rule decided."""
    ev, n = verdict.evidence, len(draft.ids)
    if ev is None:
        return []
    seen = [i for i, a in enumerate(ev.accepted) if a is not None and i not in below]
    device, k = p.device, min(TOP_K, p.shape[-1])
    rows = torch.tensor([parent + 1 for parent in draft.parents], dtype=torch.long, device=device)
    ids = torch.tensor(draft.ids, dtype=torch.long, device=device)
    q = draft.q_over(p.shape[-1], device)
    px, qx = (ev.p or p[rows, ids].tolist()), q[torch.arange(n, device=device), ids].tolist()
    picked = torch.tensor(seen, dtype=torch.long, device=device)
    tops = dict(zip(seen, zip(_pairs(p[rows[picked]].topk(k)), _pairs(q[picked].topk(k)))))  # one transfer each
    u, out = ev.u or [None] * n, []
    for i, (token, parent, depth) in enumerate(zip(draft.ids, draft.parents, depths(draft.parents))):
        if i not in tops:
            out.append(NodeRecord(token, parent, depth, None, qx[i], None, None, reasons[i]))
            continue
        prob = accept_probability(px[i], qx[i], ev.u is None, ev.exact[i])
        p_top, q_top = tops[i]
        out.append(NodeRecord(token, parent, depth, px[i], qx[i], u[i], ev.accepted[i], reasons[i], prob, p_top,
                              [pair for pair in q_top if pair[1] > 0]))
    end = verdict.path[-1] if verdict.path else -1
    rejected = [node for node in out if node.accepted is False and node.parent == end]
    if emitted > verdict.accepted and rejected:  # the step emitted the target's own token in place of a rejected draft
        if ev.corrected is None:
            rejected[-1].argmax = verdict.next_token
        else:
            top = _pairs(ev.corrected[None].topk(k))[0]
            rejected[-1].residual_top = {"top": [pair for pair in top if pair[1] > 0], "emitted": verdict.next_token}
    return out


def probs_at(p: torch.Tensor, ids: list[int], rows: list[int] | None = None) -> list[float]:
    """p[rows[i], ids[i]] for each i (rows 0, 1, … unless given)."""
    index = torch.arange(len(ids), device=p.device) if rows is None else torch.tensor(rows, dtype=torch.long, device=p.device)
    return p[index, torch.tensor(ids, dtype=torch.long, device=p.device)].tolist()


def _pairs(top) -> list[list[list]]:
    """[token, value] pairs per row of a batched ``topk``, read from the device in one transfer."""
    both = torch.stack([top.indices.double(), top.values.double()]).tolist()  # float64 holds every token id exactly
    return [[[int(t), x] for t, x in zip(ids, values)] for ids, values in zip(*both)]
