"""The decoding loop shared by every method: one generator, one :class:`StepEvent` per step.

Autoregressive decoding is the loop with no drafter (γ = 0 every step), so the baseline goes through
the same cache handling and the same timers as speculative decoding. Invariant: the target's cache
holds every committed token but the last; a step feeds ``[last] + drafts`` (a chain, or a token tree's nodes under a
tree mask) and gets one distribution per fed row, then rolls the cache back to the accepted tokens by position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch

from specviz.core.acceptance import ACCEPTED, REJECTED, UNCHECKED, ExactRule, Verdict
from specviz.core.cache import CachedModel, Forward
from specviz.core.drafters import Draft, Drafter
from specviz.core.policy import FirstDraft, LengthPolicy
from specviz.core.sampling import Sampler
from specviz.core.timing import Stopwatch
from specviz.core.tree import MAX_TREE_NODES, TreeShape, TreeVerdict, verify_tree


@dataclass
class StepEvent:
    """Everything one step did, as the CLI, benchmark and UI see it."""

    step: int
    drafter: str
    gamma: int
    draft_ids: list[int]
    draft_q: list[float]
    draft_p: list[float]
    accepted: int
    emitted_ids: list[int]
    emitted_p: list[float]
    accept_reasons: list[str]
    judge_scores: list[float] | None
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    total_ms: float
    forward_ms: float
    elapsed_ms: float
    policy: dict | None = None
    extra: dict = field(default_factory=dict)
    verify: list[dict] = field(default_factory=list)
    tree: dict | None = None

    def to_dict(self) -> dict:
        """The step as JSON; a chain's step has no ``tree`` key."""
        out = asdict(self)
        if out["tree"] is None:
            del out["tree"]
        return out


def decode(target: CachedModel, prompt_ids: Sequence[int], *, drafters: Sequence[Drafter] = (),
           rule: ExactRule | None = None, policy: LengthPolicy | None = None, selector: FirstDraft | None = None,
           sampler: Sampler | None = None, max_new_tokens: int = 64, stop_ids: Sequence[int] = (),
           tree: TreeShape | None = None, record: bool = True) -> Iterator[StepEvent]:
    """Generate up to ``max_new_tokens`` after ``prompt_ids``; yields a StepEvent after every step. With ``tree`` the
    drafter proposes a token tree of that shape each step, its node budget the policy's γ (exact rule only). Without
    ``record`` (benchmarks) the steps leave out what only the views read (p and q of each token, the verify records),
    so nothing of it is read from the device inside the timed step."""
    rule, policy = rule or ExactRule(), policy or LengthPolicy(0)
    if tree is not None and type(rule) is not ExactRule:
        raise ValueError(f"token trees are verified by the exact rule only, not {rule.name}")
    if rule.needs_states and not target.prenorm:
        raise ValueError(f"the {rule.name} rule reads the target's pre-norm states: build the target with prenorm=True")
    selector, sampler = selector or FirstDraft(), sampler or Sampler()
    watch = Stopwatch(target.lm.device)
    models = [target] + [m for d in drafters for m in d.models]
    start = watch.mark()
    tokens = list(prompt_ids)
    prefilled = target.prefill(tokens)
    for d in drafters:
        if prefilled is not None:
            d.observe(prefilled)
        d.prefill(tokens)
    generated, step = 0, 0
    while generated < max_new_tokens:
        step += 1
        t0, fwd0 = watch.mark(), _forward_seconds(models)
        drafter = selector.choose(list(drafters), tokens) if drafters else None  # None: a plain target step
        room = max_new_tokens - generated - 1  # a chain's length, a tree's depth
        gamma = max(0, min(policy.choose(drafter, tokens), room if tree is None else room and MAX_TREE_NODES)) if drafter else 0
        why = {**(policy.explain() or {}), **(selector.explain() or {})} if drafter else selector.explain() if drafters else None
        name = drafter.name if drafter else "target"
        if gamma == 0:
            draft = Draft([], None, name)
        elif tree is not None:
            draft = drafter.propose_tree(tokens, replace(tree, nodes=gamma, depth=min(gamma, room)), sampler)
        else:
            draft = drafter.propose(tokens, gamma, sampler, policy.stop_rule)
        t1 = watch.mark()
        is_tree = draft.parents is not None
        verified = target.forward(tokens if is_tree else tokens + draft.ids, keep=len(draft.ids) + 1,
                                  tree=(draft.ids, draft.parents) if is_tree else None)
        t2 = watch.mark()
        p = sampler.probs(verified.logits)
        kept = check(draft, verified, p, rule, sampler, record)
        if is_tree:  # only the accepted path's keys and values stay, moved after the committed tokens
            target.rollback(len(tokens), [len(tokens) + i for i in kept.path])
        for d in drafters:
            d.observe(along(verified, len(tokens), kept.path) if is_tree else verified)
        emitted = [draft.ids[i] for i in kept.path] + [kept.verdict.next_token]
        emitted_p = probs_at(p, emitted, [kept.rows[i] for i in kept.path] + [kept.next_row]) if record else []
        stop_at = next((i for i, t in enumerate(emitted) if t in stop_ids), None)
        if stop_at is not None:
            emitted, emitted_p = emitted[: stop_at + 1], emitted_p[: stop_at + 1]
        tokens += emitted
        generated += len(emitted)
        target.rollback(min(len(target.ids), len(tokens) - 1))  # the cache holds every committed token but the last
        drafted_p = probs_at(p, draft.ids, kept.rows) if record else []
        t3 = watch.mark()  # the accept decision and probs_at read the device: the step's marks are done, no wait below
        (draft_s, verify_s, overhead_s), total_s = (watch.seconds(a, b) for a, b in ((t0, t1), (t1, t2), (t2, t3))), watch.seconds(t0, t3)
        event = StepEvent(
            step=step, drafter=draft.drafter, gamma=gamma, draft_ids=draft.ids, draft_q=draft.q_of_ids() if record else [],
            draft_p=drafted_p, accepted=kept.verdict.accepted, emitted_ids=emitted, emitted_p=emitted_p,
            accept_reasons=kept.verdict.reasons, judge_scores=kept.verdict.judge_scores,
            draft_ms=1e3 * draft_s, verify_ms=1e3 * verify_s, overhead_ms=1e3 * overhead_s, total_ms=1e3 * total_s,
            forward_ms=1e3 * (_forward_seconds(models) - fwd0), elapsed_ms=1e3 * watch.seconds(start, t3), policy=why,
            extra=draft.extra, verify=kept.verdict.records, tree=tree_record(tree, draft, kept.tree) if kept.tree else None,
        )
        policy.observe(event)
        selector.observe(event)
        yield event
        if stop_at is not None:
            return


@dataclass(frozen=True)
class Kept:
    """What verification kept: the accepted drafts (a chain's first ones, a tree's path) and the verdict, the row of p
    each draft was scored at and the row the target's own token came from; a tree's node records."""

    path: list[int]
    verdict: Verdict
    rows: list[int]
    next_row: int
    tree: TreeVerdict | None = None


def check(draft: Draft, verified: Forward, p: torch.Tensor, rule: ExactRule, sampler: Sampler, record: bool = True) -> Kept:
    """Verify a chain with ``rule`` or a tree by recursive rejection (:func:`specviz.core.tree.verify_tree`)."""
    if draft.parents is None:
        verdict = rule.verify(draft, verified.logits, p, sampler, verified.prenorm, record)
        return Kept(list(range(verdict.accepted)), verdict, list(range(len(draft.ids))), verdict.accepted)
    checked = verify_tree(draft.ids, draft.parents, draft.q, verified.logits, p, sampler)
    path = checked.path
    return Kept(path, tree_verdict(checked), [parent + 1 for parent in draft.parents], path[-1] + 1 if path else 0, checked)


def tree_verdict(verdict: TreeVerdict) -> Verdict:
    """A tree's verdict as the chain's: the accepted path's length, the next token, one reason per node."""
    reasons = [ACCEPTED if n.accepted else UNCHECKED if n.accepted is None else REJECTED for n in verdict.nodes]
    return Verdict(len(verdict.path), verdict.next_token, reasons)


def tree_record(shape: TreeShape, draft: Draft, verdict: TreeVerdict) -> dict:
    """What a step records of its tree: kind, branching, each node's parent, the accepted path and every node's record."""
    return {"kind": shape.kind, "branch": shape.branch, "parents": draft.parents, "accepted_path": verdict.path,
            "nodes": [asdict(n) for n in verdict.nodes]}


def along(verified: Forward, length: int, path: list[int]) -> Forward:
    """A tree forward as if it had fed only the committed tokens and the accepted ``path``: its rows (the fed tokens
    up to ``length``, then the path's nodes)."""
    linear = length - verified.start
    rows = list(range(linear)) + [linear + i for i in path]
    kept = [0] + [1 + i for i in path]
    return Forward(verified.logits[kept], verified.start, None if verified.prenorm is None else verified.prenorm[kept],
                   None if verified.layers is None else {i: h[rows] for i, h in verified.layers.items()})


def probs_at(p: torch.Tensor, ids: list[int], rows: list[int] | None = None) -> list[float]:
    """p[rows[i], ids[i]] for each i (rows 0, 1, … unless given)."""
    index = torch.arange(len(ids), device=p.device) if rows is None else torch.tensor(rows, dtype=torch.long, device=p.device)
    return p[index, torch.tensor(ids, dtype=torch.long, device=p.device)].tolist()


def _forward_seconds(models: list[CachedModel]) -> float:
    return sum(m.forward_s for m in models)
