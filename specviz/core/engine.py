"""The decoding loop shared by every method: one generator, one :class:`StepEvent` per step.

Autoregressive decoding is the loop with no drafter (γ = 0 every step), so the baseline goes through
the same cache handling and the same timers as speculative decoding. Invariant: the target's cache
holds every committed token but the last; a step feeds ``[last] + drafts`` (a chain, or a token tree's nodes under a
tree mask) and gets one distribution per fed row, then rolls the cache back to the accepted tokens by position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch

from specviz.core.acceptance import ACCEPTED, REJECTED, UNCHECKED, ExactRule, Kept, Verdict
from specviz.core.cache import CachedModel, Forward
from specviz.core.drafters import Draft, Drafter
from specviz.core.policy import FirstDraft, LengthPolicy
from specviz.core.record import Recorder, StepEvent
from specviz.core.sampling import Sampler
from specviz.core.timing import Stopwatch
from specviz.core.tree import MAX_TREE_NODES, TreeShape, TreeVerdict, verify_tree


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
    recorder = Recorder(watch, watch.mark(), record)
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
        if gamma == 0:
            draft = Draft([], None, drafter.name if drafter else "target")
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
        kept = check(draft, verified, p, rule, sampler)
        if is_tree:  # only the accepted path's keys and values stay, moved after the committed tokens
            target.rollback(len(tokens), [len(tokens) + i for i in kept.path])
        for d in drafters:
            d.observe(along(verified, len(tokens), kept.path) if is_tree else verified)
        emitted = [draft.ids[i] for i in kept.path] + [kept.verdict.next_token]
        stop_at = next((i for i, t in enumerate(emitted) if t in stop_ids), None)
        emitted = emitted if stop_at is None else emitted[: stop_at + 1]
        tokens += emitted
        generated += len(emitted)
        target.rollback(min(len(target.ids), len(tokens) - 1))  # the cache holds every committed token but the last
        t3 = watch.mark()  # the accept decision read the device: the step's marks are done, no wait below
        event = recorder.step(step, draft, gamma, p, kept, emitted, (t0, t1, t2, t3), _forward_seconds(models) - fwd0, why, tree)
        policy.observe(event)
        selector.observe(event)
        yield event
        if stop_at is not None:
            return


def check(draft: Draft, verified: Forward, p: torch.Tensor, rule: ExactRule, sampler: Sampler) -> Kept:
    """Verify a chain with ``rule`` or a tree by recursive rejection (:func:`specviz.core.tree.verify_tree`)."""
    if draft.parents is None:
        verdict = rule.verify(draft, verified.logits, p, sampler, verified.prenorm)
        return Kept(list(range(verdict.accepted)), verdict, list(range(len(draft.ids))), verdict.accepted)
    checked = verify_tree(draft.ids, draft.parents, draft.q, verified.logits, p, sampler)
    path = checked.path
    return Kept(path, tree_verdict(checked), [parent + 1 for parent in draft.parents], path[-1] + 1 if path else 0, checked)


def tree_verdict(verdict: TreeVerdict) -> Verdict:
    """A tree's verdict as the chain's: the accepted path's length, the next token, one reason per node."""
    reasons = [ACCEPTED if n.accepted else UNCHECKED if n.accepted is None else REJECTED for n in verdict.nodes]
    return Verdict(len(verdict.path), verdict.next_token, reasons)


def along(verified: Forward, length: int, path: list[int]) -> Forward:
    """A tree forward as if it had fed only the committed tokens and the accepted ``path``: its rows (the fed tokens
    up to ``length``, then the path's nodes)."""
    linear = length - verified.start
    rows = list(range(linear)) + [linear + i for i in path]
    kept = [0] + [1 + i for i in path]
    return Forward(verified.logits[kept], verified.start, None if verified.prenorm is None else verified.prenorm[kept],
                   None if verified.layers is None else {i: h[rows] for i, h in verified.layers.items()})


def _forward_seconds(models: list[CachedModel]) -> float:
    return sum(m.forward_s for m in models)
