"""What a step records about its verification: every accept/reject decision recomputed from the recorded
(p, q, u) gives the engine's decision, for every acceptance rule and a chain, sampling and greedy; the residual
and the argmax are recorded at the rejection; and recording changes no emitted token."""

import pytest
import torch

from specviz.core.acceptance import ExactRule, LenientRule, TopKRule
from specviz.core.drafters import ModelDrafter, NGramDrafter
from specviz.core.engine import decode
from specviz.core.policy import FixedPolicy
from specviz.core.record import NodeRecord, StepEvent
from specviz.core.recorder import TOP_K
from specviz.core.sampling import Sampler
from specviz.methods.chain import build_chain
from specviz.methods.judge import JudgeHead, JudgeRule
from specviz.models.backends import cached_model
from tests.conftest import seeded

PROMPT = [5, 17, 3, 9, 41, 2]
RULES = {
    "exact": lambda h: ExactRule(),
    "lenient": lambda h: LenientRule(0.5),
    "topk": lambda h: TopKRule(3),
    "judge": lambda h: JudgeRule(JudgeHead(torch.randn(h, generator=seeded(0)), 0.0, "tiny", h), 0.5),
}


def run(target, draft, rule, sampler, chain=None, n=40, record=True):
    drafter = build_chain(ModelDrafter(cached_model(draft)), [cached_model(chain)], 2) if chain else ModelDrafter(cached_model(draft))
    verifier = cached_model(target, taps=rule.reads_layers(target.model.config.num_hidden_layers))
    return list(decode(verifier, PROMPT, drafters=[drafter], rule=rule,
                       policy=FixedPolicy(4), sampler=sampler, max_new_tokens=n, record=record))


def f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def relaxed_accepts(rule, v: NodeRecord, e: StepEvent, i: int) -> bool:
    """The rule's own criterion, from what the record holds (a scoring rule's in the step's scores)."""
    if isinstance(rule, LenientRule):
        return bool(f32(v.u) * f32(v.q) * rule.lenience < f32(v.p))
    if isinstance(rule, TopKRule):
        return v.token in [t for t, _ in v.p_top[: rule.k]]
    if isinstance(rule, JudgeRule):
        return e.scores.scores[i] > e.scores.threshold
    return False


def check_decisions(events, rule) -> int:
    decided = 0
    for e in events:
        assert len(e.checked) == min(e.accepted + 1, len(e.draft_ids))  # accepted positions and the first rejection
        for i, v in enumerate(e.checked):
            exact = bool(f32(v.u) * f32(v.q) < f32(v.p))
            assert v.accepted == (exact or relaxed_accepts(rule, v, e, i)) == (i < e.accepted)
            assert v.reason == ("exact" if exact else rule.name) if v.accepted else v.reason == "rejected"
            assert v.accept_prob == pytest.approx(min(1.0, v.p / v.q))
            assert v.token == e.draft_ids[i] and 0 <= v.u < 1
            assert len(v.p_top) == min(TOP_K, 96) and v.p_top[0][1] >= v.p - 1e-6
            decided += 1
        if e.accepted < len(e.draft_ids):
            res = e.checked[e.accepted].residual_top
            assert res["emitted"] == e.emitted_ids[e.accepted] and abs(sum(x for _, x in res["top"]) - 1) < 1 + 1e-6
    return decided


@pytest.mark.parametrize("name", sorted(RULES))
def test_sampled_decisions_recompute_from_p_q_u(tiny_target, tiny_draft, name):
    rule = RULES[name](tiny_target.model.config.hidden_size)
    decided = sum(check_decisions(run(tiny_target, tiny_draft, rule, Sampler(0.8, 0.9, seed)), rule) for seed in range(3))
    assert decided > 30


def test_a_chains_decisions_and_levels_are_recorded(tiny_target, tiny_draft):
    events = run(tiny_target, tiny_draft, ExactRule(), Sampler(0.8, 0.9, 1), chain=tiny_draft)
    assert check_decisions(events, ExactRule()) > 10
    levels = [lv for e in events for lv in e.levels if lv.blocks]
    assert levels and all(b["passed"] and len(b["passed"]) <= len(b["drafted"]) + 1 for lv in levels for b in lv.blocks)


def test_greedy_records_the_argmax_comparison(tiny_target, tiny_draft):
    events = run(tiny_target, tiny_draft, ExactRule(), Sampler())
    for e in events:
        for i, v in enumerate(e.checked):
            assert v.u is None and v.accept_prob == float(v.accepted)
            if not v.accepted:
                assert v.argmax == e.emitted_ids[i] != v.token
    assert any(not v.accepted for e in events for v in e.checked)


def test_ngram_drafts_record_a_one_hot_q(tiny_target):
    events = list(decode(cached_model(tiny_target), [1, 2, 3, 1, 2, 3, 1, 2], drafters=[NGramDrafter()], policy=FixedPolicy(3),
                         sampler=Sampler(0.8, 1.0, 0), max_new_tokens=20))
    records = [v for e in events for v in e.checked]
    assert records and all(v.q == 1.0 and v.q_top == [[v.token, 1.0]] for v in records)


@pytest.mark.parametrize("name", sorted(RULES))
def test_recording_changes_no_token(tiny_target, tiny_draft, name):
    rule = RULES[name](tiny_target.model.config.hidden_size)
    a = run(tiny_target, tiny_draft, rule, Sampler(0.8, 0.9, 5))
    b = run(tiny_target, tiny_draft, rule, Sampler(0.8, 0.9, 5), record=False)
    assert [e.emitted_ids for e in a] == [e.emitted_ids for e in b] and all(e.checked for e in a if e.draft_ids)
    assert not any(e.checked for e in b)


def test_records_cross_the_trace_boundary_as_they_were(tiny_target, tiny_draft):
    from specviz.core.record import StepEvent

    events = run(tiny_target, tiny_draft, RULES["judge"](tiny_target.model.config.hidden_size), Sampler(0.8, 0.9, 2))
    assert all(StepEvent.from_dict(e.to_dict()) == e for e in events)
    rejected = next(e for e in events if e.accepted < len(e.draft_ids)).to_dict()["verify"]
    assert "residual_top" in rejected[-1] and "argmax" not in rejected[-1] and "score" in rejected[0]
