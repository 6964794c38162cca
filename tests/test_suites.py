"""The evaluation suites and the texts a training recipe must leave out."""

import json

import pytest

from specviz.analysis.suites import PROMPTS, evaluation_texts, load_suite, load_warmup


def _suite_files():
    return {f.stem: [json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in sorted(PROMPTS.glob("*.jsonl"))}


def test_load_suite_all_reads_every_category():
    files = _suite_files()
    items = load_suite("all")
    assert len(items) == sum(len(v) for v in files.values()) and len(files) >= 6
    assert len({r["id"] for r in items}) == len(items)
    assert {r["category"] for r in items} == set(files)
    assert all(r["prompt"] for r in items)


@pytest.mark.parametrize("per_category", [1, 2, 3])
def test_load_suite_per_category_takes_the_first_of_each_file(per_category):
    files = _suite_files()
    items = load_suite("all", per_category)
    assert items == [r for rows in files.values() for r in rows[:per_category]]
    assert all(sum(r["category"] == c for r in items) == per_category for c in files)


def test_load_suite_subset():
    items = load_suite("math,code", 2)
    assert [r["id"] for r in items] == ["code-01", "code-02", "math-01", "math-02"]
    assert all("answer" in r for r in items if r["category"] == "math")
    assert load_suite("nonexistent") == []


def test_load_suite_judge_eval_per_category():
    everything = load_suite("judge-eval")
    assert all(r["prompt"] == r["question"] and r["expected"] for r in everything)
    picked = load_suite("judge-eval", 2)
    categories = {r["category"] for r in everything}
    assert len(categories) > 1
    for c in categories:
        assert [r["id"] for r in picked if r["category"] == c] == [r["id"] for r in everything if r["category"] == c][:2]
    assert [r["id"] for r in picked] == [r["id"] for r in everything if r in picked]  # file order kept


def test_evaluation_texts_cover_the_suites_and_the_judge_questions():
    texts = evaluation_texts()
    assert "Write a Python function that reverses a string." in texts
    assert {r["question"] for r in load_suite("judge-eval")} <= texts
    assert {r["prompt"].strip() for r in load_suite("all")} <= texts


def test_warmup_prompts_cover_every_category_and_are_not_evaluation_prompts():
    warmup, suites = load_warmup(), load_suite("all")
    categories = {r["category"] for r in suites}
    assert {r["category"] for r in warmup} == categories and len({r["id"] for r in warmup}) == len(warmup)
    assert all(sum(r["category"] == c for r in warmup) >= 4 for c in categories)
    others = {r["prompt"].strip() for r in suites} | {r["question"].strip() for r in load_suite("judge-eval")}
    assert not {r["prompt"].strip() for r in warmup} & others
    assert {r["prompt"].strip() for r in warmup} <= evaluation_texts()  # so no draft is ever trained on them


def test_load_warmup_takes_the_categories_round_robin():
    first = load_warmup(len({r["category"] for r in load_warmup()}))
    assert len({r["category"] for r in first}) == len(first)
    assert load_warmup(0) == load_warmup() and len(load_warmup(7)) == 7
