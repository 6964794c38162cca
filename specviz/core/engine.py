"""The decoding loop shared by every method: one generator, one :class:`StepEvent` per step.

Autoregressive decoding is the loop with no drafter (nothing drafted every step), so the baseline goes through the
same cache handling and the same timers as speculative decoding. Every draft is a token tree (a single path: one child per
node). Invariant: the target's cache holds every committed token but the last; a step feeds the last token and the
draft's nodes, gets one distribution per fed row, and commits the accepted path by position. The target's tapped
states of the committed slots are handed to the drafters (those that draft from them keep them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial

from specviz.core.acceptance import ExactRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import SINGLE_PATH, Draft, Drafter, step_size
from specviz.core.policy import Choice, FirstDraft, FixedPolicy, LengthPolicy, Outcome, Pick
from specviz.core.record import StepEvent
from specviz.core.recorder import Recorder, StepMarks
from specviz.core.sampling import Sampler
from specviz.core.timing import Stopwatch
from specviz.core.tree import TreeShape, depths


def decode(target: CachedModel, prompt_ids: Sequence[int], *, drafters: Sequence[Drafter] = (),
           rule: ExactRule | None = None, policy: LengthPolicy | None = None, selector: FirstDraft | None = None,
           sampler: Sampler | None = None, max_new_tokens: int = 64, stop_ids: Sequence[int] = (),
           tree: TreeShape = SINGLE_PATH, record: bool = True) -> Iterator[StepEvent]:
    """Generate up to ``max_new_tokens`` after ``prompt_ids``; yields a StepEvent after every step. Drafts grow as
    ``tree`` says (a single path unless a :class:`TreeShape` is given; the policy's γ is then a node budget, and only the exact
    rule verifies branching trees). Without ``record`` (benchmarks) the steps leave out what only the views read (p and
    q of each token, the verify records), so nothing of it is read from the device."""
    rule, policy = rule or ExactRule(), policy or FixedPolicy(0)
    if rule.needs_states and not target.prenorm:
        raise ValueError(f"the {rule.name} rule reads the target's pre-norm states: build the target with its last layer "
                         "among its taps")
    selector, sampler = selector or FirstDraft(), sampler or Sampler()
    watch = Stopwatch(target.lm.device)
    models = [target] + [m for d in drafters for m in d.models]
    recorder = Recorder(watch, watch.mark(), sampler, record)
    tokens = list(prompt_ids)
    prefilled = target.prefill(tokens)
    for d in drafters:
        if prefilled and prefilled.layers:
            d.read_states(prefilled.start, prefilled.layers)
        d.prefill(tokens)
    generated, step = 0, 0
    while generated < max_new_tokens:
        step += 1
        start, fwd0 = watch.mark(), sum(m.forward_s for m in models)
        pick = selector.choose(list(drafters), tokens)
        choice = policy.choose(pick.drafter, tokens) if pick.drafter else None
        nodes, depth = step_size(tree, choice.gamma, max_new_tokens - generated - 1) if choice else (0, 0)
        decided = watch.mark()
        draft = pick.drafter.draft(tokens, nodes, depth, tree, sampler, choice.stop, record) if pick.drafter else Draft([], None, "target")
        drafted = watch.mark()
        verified = target.verify(tokens, draft.tree)
        verdict = rule.verify(draft, verified.logits, sampler, verified.prenorm)
        checked = watch.mark()  # the accept decision read the device: the marks so far are done, reading them waits on nothing
        emitted = [int(draft.ids[i]) for i in verdict.path] + [verdict.next_token]  # the ids verification read
        stop_at = next((i for i, t in enumerate(emitted) if t in stop_ids), None)
        emitted = emitted if stop_at is None else emitted[: stop_at + 1]
        path = verdict.path[: len(emitted) - 1]
        target.commit(len(tokens), path)
        if states := verified.kept(len(tokens) - 1, path):  # the committed slots' tapped states, handed to the drafters
            for d in drafters:
                d.read_states(len(tokens) - 1, states)
        tokens += emitted
        generated += len(emitted)
        committed = watch.mark()
        outcome = Outcome(len(draft.ids), min(verdict.accepted, len(emitted)), 1e3 * watch.seconds(decided, drafted),
                          1e3 * watch.seconds(drafted, checked), len(emitted), 1e3 * watch.seconds(start, committed),
                          max(depths(draft.parents), default=0), draft.drafter, tuple(draft.confidence or ()))
        policy.observe(outcome)
        selector.observe(outcome)
        marks = StepMarks(start, decided, drafted, checked, committed, watch.mark())
        yield recorder.step(step, outcome, draft, choice.gamma if choice else 0, verified.logits, verdict, emitted, marks,
                            1e3 * (sum(m.forward_s for m in models) - fwd0), partial(step_reasons, choice, pick), tree)
        if stop_at is not None:
            return


def step_reasons(choice: Choice | None, pick: Pick) -> dict:
    """A step's reasons, kept apart: the γ policy's (none for a plain step the selector chose) and the selector's."""
    return {"policy": choice.why() if choice else None, "selector": pick.why() if pick.why else None}
