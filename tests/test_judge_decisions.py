"""Outcome-labelled decisions: which questions they may use, and what counts as keeping the answer."""

import pytest

from specviz.training import judge_questions as jq
from specviz.training.judge_decisions import answer_key, on_policy_questions, training_questions


def test_training_questions_never_touch_the_held_out_or_eval_questions():
    qs = jq.questions()
    split = jq.splits(qs)
    forbidden = {q.text for q in qs if split[q.text] == "heldout"} | {e["question"] for e in jq.eval_questions(qs, split)}
    picked = training_questions(40)
    texts = [q.text for q in picked]
    assert len(texts) == len(set(texts)) and not forbidden & set(texts)
    assert {q.category for q in picked} == {"arithmetic", "units", "facts"} and all(q.expected for q in picked)
    fresh = [q for q in picked if q.text not in {x.text for x in qs}]
    assert len(fresh) == 40 and training_questions(40)[-1].text == texts[-1]  # seeded


@pytest.mark.parametrize("text, expected, key", [
    ("7 + 5 = 12. The answer is 12.", "12", "12"),
    ("It is 1,250 metres, not 1250.5", "1250", "1250.5"),
    ("No number here.", "3", None),
    ("The capital of France is Paris.", "Paris", "Paris"),
    ("The capital of France is Lyon.", "Paris", None),
])
def test_the_answer_key_is_the_last_number_or_the_expected_word(text, expected, key):
    q = jq.Question("x", "q", ("{r}",), {}, (), (expected,))
    assert answer_key(text, q) == key


def test_each_on_policy_round_draws_its_own_questions_and_round_one_keeps_its_draw():
    import random

    first = sorted(random.Random(f"{jq.SEED}:decisions:on-policy").sample(range(400), 100))  # the committed round 1
    assert on_policy_questions(100, 400, jq.SEED, 1) == first
    second = on_policy_questions(100, 400, jq.SEED, 2)
    assert second != first and len(set(second)) == 100 and on_policy_questions(100, 400, jq.SEED, 2) == second
