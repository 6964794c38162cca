"""Greedy exactness of every drafter against transformers' own generate, on tiny random models."""

import time

import pytest
import torch

from specviz.core.acceptance import ExactRule
from specviz.core.cache import CachedModel
from specviz.core.drafters import SINGLE_PATH, EarliestNGramDrafter, ModelDrafter, NGramDrafter, ngram_proposal
from specviz.core.engine import decode
from specviz.core.metrics import summarize
from specviz.core.policy import Choice, FixedPolicy, LengthPolicy
from specviz.core.record import SPANS
from specviz.core.sampling import Sampler
from specviz.core.tree import TreeShape
from specviz.models.backends import cached_model


def reference(lm, prompt, n):
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                do_sample=False, max_new_tokens=n)
    return out[0, len(prompt):].tolist()


def run(lm, prompt, n, drafters=(), gamma=0, stop_ids=()):
    events = list(decode(cached_model(lm), prompt, drafters=list(drafters), rule=ExactRule(), policy=FixedPolicy(gamma),
                         sampler=Sampler(), max_new_tokens=n, stop_ids=stop_ids))
    return [t for e in events for t in e.emitted_ids], events


PROMPTS = [[5, 17, 3, 9], [1, 2, 3, 1, 2, 3, 1, 2], [42], list(range(10, 40))]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ar_matches_generate(tiny_target, prompt):
    out, events = run(tiny_target, prompt, 40)
    assert out == reference(tiny_target, prompt, 40)
    assert all(e.gamma == 0 and len(e.emitted_ids) == 1 for e in events)


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("which", ["other", "self", "ngram", "ngram-earliest"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_sd_matches_generate(tiny_target, tiny_draft, which, gamma, prompt):
    drafter = {"other": lambda: ModelDrafter(cached_model(tiny_draft)),
               "self": lambda: ModelDrafter(cached_model(tiny_target)),
               "ngram": lambda: NGramDrafter(), "ngram-earliest": lambda: EarliestNGramDrafter()}[which]()
    out, events = run(tiny_target, prompt, 40, [drafter], gamma)
    assert out == reference(tiny_target, prompt, 40)
    assert len(out) == 40
    if which == "self":  # a draft identical to the target is always accepted: γ + 1 tokens per step
        assert all(e.accepted == e.drafted for e in events) and all(e.gamma == gamma for e in events)
        assert summarize(events)["mean_accept_len"] > gamma


def test_stop_token_ends_generation(tiny_target):
    full, _ = run(tiny_target, PROMPTS[0], 30)
    stop = full[7]
    out, _ = run(tiny_target, PROMPTS[0], 30, [ModelDrafter(cached_model(tiny_target))], 4, stop_ids=[stop])
    assert out == full[: full.index(stop) + 1]


class Pieces:
    """A token's text without a tokenizer (for the token view's spans)."""

    def piece(self, context, token):
        return f"<{token}>"


def a_stop_among_accepted_drafts(events) -> tuple[int, int]:
    """A token the run first emitted as an accepted draft with accepted drafts after it, and its place in the output."""
    seen: list[int] = []
    for e in events:
        for k, token in enumerate(e.emitted_ids):
            if token not in seen and k < e.accepted - 1:
                return token, len(seen)
            seen.append(token)
    raise AssertionError("no step emitted a new token among its accepted drafts")


def ends_at_the_output(e) -> bool:
    """A chain step's record holds nothing accepted past its output: its accepted count, reasons and verify records end
    where its emitted tokens do."""
    return (e.accepted <= len(e.emitted_ids) and e.emitted_ids[: e.accepted] == e.draft_ids[: e.accepted]
            and set(e.accept_reasons[e.accepted:]) <= {"rejected", "unchecked"} and len(e.checked) <= len(e.emitted_ids)
            and all(v.accepted == (i < e.accepted) for i, v in enumerate(e.checked)))


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_a_stop_token_among_accepted_drafts_ends_the_steps_record(tiny_target, temperature):
    from specviz.core.record import StepEvent
    from specviz.viz.teach import microscope_html, narrate
    from specviz.viz.trace import step_spans

    def steps(stop_ids=()):  # the target drafting for itself: its drafts are accepted
        return list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[ModelDrafter(cached_model(tiny_target))],
                           policy=FixedPolicy(4), sampler=Sampler(temperature, seed=2), max_new_tokens=30, stop_ids=stop_ids))

    full = steps()
    stop, at = a_stop_among_accepted_drafts(full)
    events = steps([stop])
    out = [t for e in events for t in e.emitted_ids]
    assert out == [t for e in full for t in e.emitted_ids][: at + 1] and out[-1] == stop
    last = events[-1]
    assert last.accepted == len(last.emitted_ids) == len(last.checked) < len(last.draft_ids)
    assert last.accept_reasons[last.accepted:] == ["unchecked"] * (len(last.draft_ids) - last.accepted)
    assert all(ends_at_the_output(e) for e in events)
    metrics = summarize(events)
    assert metrics["accepted"] == sum(e.accepted for e in events) <= metrics["new_tokens"] - len(events) + 1
    assert all(StepEvent.from_dict(e.to_dict()) == e for e in events)
    context = list(PROMPTS[0])
    for e in (x.to_dict() for x in events):  # the views end at the stop token too
        spans = step_spans(e, context, Pieces())
        assert [s.token_id for s in spans if s.kind not in ("rejected", "unchecked")] == e["emitted_ids"]
        context += e["emitted_ids"]
    words, page = narrate(last.to_dict(), {}), microscope_html(last.to_dict(), {})
    assert "is a stop token: the output ends there" in words and "after the stop token" in words and "target then emitted" not in words
    assert page.count('class="sv-mic-pos sv-mic-ok"') == last.accepted and "sv-mic-no" not in page


def test_caches_roll_back_to_committed_prefix(tiny_target, tiny_draft):
    target, draft = CachedModel(tiny_target), CachedModel(tiny_draft)
    tokens = list(PROMPTS[0])
    for event in decode(target, tokens, drafters=[ModelDrafter(draft)], policy=FixedPolicy(5), max_new_tokens=30):
        tokens += event.emitted_ids
        # the target holds every committed token but the last; neither model keeps rejected drafts
        assert target.ids[: len(tokens) - 1] == tokens[:-1]
        assert target.storage.cache.get_seq_length() == len(target.ids)
        assert draft.storage.cache.get_seq_length() == len(draft.ids)
    target.forward(tokens, keep=1)
    assert target.ids == tokens and target.storage.cache.get_seq_length() == len(tokens)


def test_a_steps_spans_add_up_to_its_time_and_the_policy_learns_the_drafting_span_alone(tiny_target, tiny_draft):
    seen = []

    class Watching(LengthPolicy):
        def observe(self, outcome):
            seen.append(outcome)

    events = []
    for e in decode(cached_model(tiny_target), PROMPTS[3], drafters=[ModelDrafter(cached_model(tiny_draft))], policy=Watching(3),
                    max_new_tokens=20):
        events.append(e)
        time.sleep(0.05)  # the caller's time between steps: no span's, and not the prefill's
    for e, outcome in zip(events, seen, strict=True):
        assert list(e.spans) == list(SPANS) and min(e.spans.values()) >= 0
        assert sum(e.spans.values()) == pytest.approx(e.total_ms, rel=0.02)
        assert (outcome.draft_ms, outcome.verify_ms) == (e.spans["drafting"], e.spans["verifying"])
        assert 0 < e.forward_ms <= e.total_ms
        assert len(e.accept_reasons) == len(e.draft_ids) == e.drafted and len(e.emitted_p) == len(e.emitted_ids)
    assert [e.elapsed_ms for e in events] == sorted(e.elapsed_ms for e in events)
    m = summarize(events)
    assert m["prefill_ms"] == pytest.approx(events[0].elapsed_ms - events[0].total_ms)
    assert m["outside_ms"] >= 50 * (len(events) - 1) > m["prefill_ms"]
    assert 1e3 * m["wall_s"] == pytest.approx(m["prefill_ms"] + sum(e.total_ms for e in events) + m["outside_ms"])
    assert m["spans_ms"] == pytest.approx({k: sum(e.spans[k] for e in events) for k in SPANS})


def test_a_step_names_the_policys_budget_and_what_was_drafted_apart(tiny_target):
    events = list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[ModelDrafter(cached_model(tiny_target))],
                         policy=FixedPolicy(5), max_new_tokens=8))  # the target drafting for itself: 6 tokens, then 2 left
    assert [(e.gamma, e.drafted) for e in events] == [(5, 5), (5, 1)]
    assert events[-1].why["policy"] == {"policy": "fixed", "gamma": 5}


def test_reasons_are_built_only_for_a_step_that_records(tiny_target, tiny_draft):
    built = []

    class Counting(LengthPolicy):
        def choose(self, drafter, tokens):
            return Choice(self.gamma, lambda: built.append(1) or {"policy": "counting"})

    def steps(record):
        return list(decode(cached_model(tiny_target), PROMPTS[0], drafters=[ModelDrafter(cached_model(tiny_draft))],
                           policy=Counting(2), max_new_tokens=10, record=record))

    assert all(e.why is None for e in steps(False)) and built == []
    events = steps(True)
    assert len(built) == len(events) and all(e.why == {"policy": {"policy": "counting"}, "selector": None} for e in events)


def test_with_draft_selection_the_policys_and_the_selectors_reasons_stay_apart(tiny_target, tiny_draft):
    from specviz.methods.policies import OnlinePolicy
    from specviz.methods.selection import OnlineSelector, PerDrafterPolicy

    events = list(decode(cached_model(tiny_target), PROMPTS[1], drafters=[ModelDrafter(cached_model(tiny_draft)), NGramDrafter()],
                         policy=PerDrafterPolicy(OnlinePolicy), selector=OnlineSelector(), max_new_tokens=40))
    policy_reasons = {"no history yet: initial γ", "argmax of predicted tokens/s", "probe: γ* = 0 for a while, the best drafting γ"}
    for e in events:
        policy, selector = e.why["policy"], e.why["selector"]
        assert selector["selector"] == "online-select" and selector["drafter"] == (e.drafter if policy else None)
        assert policy is None or (policy["policy"] == "online" and policy["reason"] in policy_reasons
                                  and policy["gamma"] == e.gamma and not isinstance(policy.get("acc", 0.0), dict))
    assert any(e.why["policy"] and "acc" in e.why["policy"] for e in events)


@pytest.mark.parametrize("tokens, gamma, expected", [
    ([1, 2, 3, 9, 1, 2], 3, [3, 9, 1]),          # longest suffix [1, 2] matched earlier
    ([7, 8, 7, 8, 7], 2, [8, 7]),                # most recent match wins
    ([1, 2, 3], 4, []),                           # nothing to copy
    ([4, 4, 4], 0, []),
])
def test_prompt_lookup(tokens, gamma, expected):
    assert NGramDrafter(max_ngram=3).draft(tokens, gamma, gamma, SINGLE_PATH, Sampler()).ids == expected


@pytest.mark.parametrize("tokens", [[5, 6, 7, 5, 6, 8, 5, 6], [1, 2, 3, 9, 2, 3, 4, 2, 3], [7, 8, 7, 8, 7], [1, 2, 3], [4, 1, 2, 9, 2]])
@pytest.mark.parametrize("shape", [SINGLE_PATH, TreeShape(2, "dynamic")])
def test_the_earliest_match_drafter_drafts_vllms_proposal_in_any_shape(tokens, shape):
    """Where the latest match and the earliest differ, ngram-earliest drafts what vLLM's n-gram proposer proposes."""
    drafter = EarliestNGramDrafter()
    for gamma in (1, 3, 5):
        draft = drafter.draft(tokens, gamma, gamma, shape, Sampler())
        assert draft.ids == ngram_proposal(tokens, 1, 3, gamma) and draft.tree.is_single_path
        assert drafter.can_draft(tokens) == bool(draft.ids) and draft.q_of_ids() == [1.0] * len(draft.ids)
