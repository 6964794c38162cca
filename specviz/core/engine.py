"""The decoding loop shared by every method: one generator, one :class:`StepEvent` per step.

Autoregressive decoding is the loop with no drafter (nothing drafted every step), so the baseline goes through the
same cache handling and the same timers as speculative decoding. Every draft is a token tree (a chain: one child per
node). Invariant: the target's cache holds every committed token but the last; a step feeds the last token and the
draft's nodes, gets one distribution per fed row, and commits the accepted path by position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from specviz.core.acceptance import ExactRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import CHAIN, Draft, Drafter, step_size
from specviz.core.policy import FirstDraft, LengthPolicy, Outcome
from specviz.core.record import Recorder, StepEvent
from specviz.core.sampling import Sampler
from specviz.core.timing import Stopwatch
from specviz.core.tree import TreeShape, depths


def decode(target: CachedModel, prompt_ids: Sequence[int], *, drafters: Sequence[Drafter] = (),
           rule: ExactRule | None = None, policy: LengthPolicy | None = None, selector: FirstDraft | None = None,
           sampler: Sampler | None = None, max_new_tokens: int = 64, stop_ids: Sequence[int] = (),
           tree: TreeShape = CHAIN, record: bool = True) -> Iterator[StepEvent]:
    """Generate up to ``max_new_tokens`` after ``prompt_ids``; yields a StepEvent after every step. Drafts grow as
    ``tree`` says (a chain unless a :class:`TreeShape` is given; the policy's γ is then a node budget, and only the exact
    rule verifies branching trees). Without ``record`` (benchmarks) the steps leave out what only the views read (p and
    q of each token, the verify records), so nothing of it is read from the device."""
    rule, policy = rule or ExactRule(), policy or LengthPolicy(0)
    if rule.needs_states and not target.prenorm:
        raise ValueError(f"the {rule.name} rule reads the target's pre-norm states: build the target with prenorm=True")
    selector, sampler = selector or FirstDraft(), sampler or Sampler()
    watch = Stopwatch(target.lm.device)
    models = [target] + [m for d in drafters for m in d.models]
    recorder = Recorder(watch, watch.mark(), record)
    tokens = list(prompt_ids)
    target.prefill(tokens)
    for d in drafters:
        d.prefill(tokens)
    generated, step = 0, 0
    while generated < max_new_tokens:
        step += 1
        t0, fwd0 = watch.mark(), sum(m.forward_s for m in models)
        pick = selector.choose(list(drafters), tokens)
        choice = policy.choose(pick.drafter, tokens) if pick.drafter else None
        nodes, depth = step_size(tree, choice.gamma, max_new_tokens - generated - 1) if choice else (0, 0)
        draft = pick.drafter.draft(tokens, nodes, depth, tree, sampler, choice.stop) if pick.drafter else Draft([], None, "target")
        t1 = watch.mark()
        verified = target.verify(tokens, draft.tree)
        t2 = watch.mark()
        p = sampler.probs(verified.logits)
        verdict = rule.verify(draft, verified.logits, p, sampler, verified.prenorm)
        emitted = [draft.ids[i] for i in verdict.path] + [verdict.next_token]
        stop_at = next((i for i, t in enumerate(emitted) if t in stop_ids), None)
        emitted = emitted if stop_at is None else emitted[: stop_at + 1]
        target.commit(len(tokens), verdict.path[: len(emitted) - 1])
        tokens += emitted
        generated += len(emitted)
        t3 = watch.mark()  # the accept decision read the device: the step's marks are done, no wait below
        ms = [1e3 * watch.seconds(a, b) for a, b in ((t0, t1), (t1, t2), (t0, t3))]
        outcome = Outcome(len(draft.ids), min(verdict.accepted, len(emitted)), ms[0], ms[1], len(emitted), ms[2],
                          max(depths(draft.parents), default=0), draft.drafter)
        policy.observe(outcome)
        selector.observe(outcome)
        why = {**((choice.why or {}) if choice else {}), **(pick.why or {})} or None
        yield recorder.step(step, outcome, draft, nodes, p, verdict, emitted, 1e3 * watch.seconds(recorder.start, t3),
                            1e3 * (sum(m.forward_s for m in models) - fwd0), why, tree)
        if stop_at is not None:
            return
