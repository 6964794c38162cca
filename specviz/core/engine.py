"""The decoding loop shared by every method: one generator, one :class:`StepEvent` per step.

Autoregressive decoding is the loop with no drafter (γ = 0 every step), so the baseline goes through
the same cache handling and the same timers as speculative decoding. Invariant: the target's cache
holds every committed token but the last; a step feeds ``[last] + drafts`` and gets γ + 1 distributions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch

from specviz.core.acceptance import ExactRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import Draft, Drafter
from specviz.core.policy import FirstDraft, LengthPolicy
from specviz.core.sampling import Sampler
from specviz.core.timing import Stopwatch


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

    def to_dict(self) -> dict:
        return asdict(self)


def decode(target: CachedModel, prompt_ids: Sequence[int], *, drafters: Sequence[Drafter] = (),
           rule: ExactRule | None = None, policy: LengthPolicy | None = None, selector: FirstDraft | None = None,
           sampler: Sampler | None = None, max_new_tokens: int = 64, stop_ids: Sequence[int] = ()) -> Iterator[StepEvent]:
    """Generate up to ``max_new_tokens`` after ``prompt_ids``; yields a StepEvent after every step."""
    rule, policy = rule or ExactRule(), policy or LengthPolicy(0)
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
        gamma = max(0, min(policy.choose(drafter, tokens), max_new_tokens - generated - 1)) if drafter else 0
        why = {**(policy.explain() or {}), **(selector.explain() or {})} if drafter else selector.explain() if drafters else None
        name = drafter.name if drafter else "target"
        draft = drafter.propose(tokens, gamma, sampler, policy.stop_rule) if gamma > 0 else Draft([], None, name)
        t1 = watch.mark()
        verified = target.forward(tokens + draft.ids, keep=len(draft.ids) + 1)
        t2 = watch.mark()
        for d in drafters:
            d.observe(verified)
        logits = verified.logits
        p = sampler.probs(logits)
        verdict = rule.verify(draft, logits, p, sampler, verified.prenorm)
        emitted = draft.ids[: verdict.accepted] + [verdict.next_token]
        emitted_p = probs_at(p, emitted)
        stop_at = next((i for i, t in enumerate(emitted) if t in stop_ids), None)
        if stop_at is not None:
            emitted, emitted_p = emitted[: stop_at + 1], emitted_p[: stop_at + 1]
        tokens += emitted
        generated += len(emitted)
        drafted_p = probs_at(p, draft.ids)
        t3 = watch.mark()  # the accept decision and probs_at read the device: the step's marks are done, no wait below
        (draft_s, verify_s, overhead_s), total_s = (watch.seconds(a, b) for a, b in ((t0, t1), (t1, t2), (t2, t3))), watch.seconds(t0, t3)
        event = StepEvent(
            step=step, drafter=draft.drafter, gamma=gamma, draft_ids=draft.ids, draft_q=draft.q_of_ids(),
            draft_p=drafted_p, accepted=verdict.accepted, emitted_ids=emitted, emitted_p=emitted_p,
            accept_reasons=verdict.reasons, judge_scores=verdict.judge_scores,
            draft_ms=1e3 * draft_s, verify_ms=1e3 * verify_s, overhead_ms=1e3 * overhead_s, total_ms=1e3 * total_s,
            forward_ms=1e3 * (_forward_seconds(models) - fwd0), elapsed_ms=1e3 * watch.seconds(start, t3), policy=why,
            extra=draft.extra, verify=verdict.records,
        )
        policy.observe(event)
        selector.observe(event)
        yield event
        if stop_at is not None:
            return


def probs_at(p: torch.Tensor, ids: list[int]) -> list[float]:
    """p[i, ids[i]] for each position i."""
    rows = torch.arange(len(ids), device=p.device)
    return p[rows, torch.tensor(ids, dtype=torch.long, device=p.device)].tolist()


def _forward_seconds(models: list[CachedModel]) -> float:
    return sum(m.forward_s for m in models)
