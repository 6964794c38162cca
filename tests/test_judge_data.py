"""The judge-decoding dataset: committed files, error_at semantics, splits, scoring and a deterministic build."""

import json
import re
from collections import Counter

import pytest

from specviz import judge_data as jd

KEYS = {"id", "category", "question", "answer", "error_at", "split", "source"}


def load(name):
    return [json.loads(line) for line in (jd.OUT_DIR / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def items():
    return load("dataset.jsonl")


@pytest.fixture(scope="module")
def by_text():
    by = {}
    for q in jd.questions():
        by.setdefault(q.text, []).append(q)
    return by


def number_at(text, pos):
    return next(v for p, v in jd.numbers(text) if p == pos)


def test_schema_and_counts(items):
    assert len(items) >= 450
    assert len({i["id"] for i in items}) == len(items)
    for i in items:
        assert set(i) == KEYS
        assert i["category"] in jd.CATEGORIES and i["split"] in ("train", "heldout")
        assert i["source"] in ("template", "paraphrase", "target")
        assert isinstance(i["question"], str) and isinstance(i["answer"], str) and i["answer"]
        assert i["error_at"] is None or (isinstance(i["error_at"], int) and 0 <= i["error_at"] < len(i["answer"]))
    cats = Counter(i["category"] for i in items)
    assert all(0.14 < cats[c] / len(items) < 0.26 for c in jd.CATEGORIES), cats
    assert 0.5 <= sum(i["error_at"] is None for i in items) / len(items) <= 0.6
    assert 0.12 < sum(i["split"] == "heldout" for i in items) / len(items) < 0.28
    target = [i for i in items if i["source"] == "target"]
    assert len(target) >= 80 and {i["category"] for i in target} == set(jd.TARGET_CATEGORIES)
    assert all(len(i["answer"]) <= jd.MAX_CHARS and "\n\n" not in i["answer"] for i in target)


def test_split_is_by_question(items):
    splits = {}
    for i in items:
        splits.setdefault(i["question"], set()).add(i["split"])
    assert all(len(s) == 1 for s in splits.values())


def test_eval_questions(items):
    evals = load("eval_questions.jsonl")
    train = {i["question"] for i in items if i["split"] == "train"}
    assert len(evals) >= 40 and len({e["id"] for e in evals}) == len(evals)
    assert {e["category"] for e in evals} == {"arithmetic", "units", "facts"}
    for e in evals:
        assert set(e) == {"id", "category", "question", "expected"} and e["expected"]
        assert e["question"] not in train


def test_template_answers_render_the_question(items, by_text):
    """A correct template answer is a phrasing filled with the right values; a wrong one agrees with such a
    rendering up to error_at (up to the blank before it, for an extra word) and differs from it."""
    for i in (i for i in items if i["source"] != "target"):
        renders = [p.format(**q.right) for q in by_text[i["question"]] for p in q.phrasings]
        if i["error_at"] is None:
            assert i["answer"] in renders, i
        else:
            prefix = i["answer"][: i["error_at"]].rstrip()
            assert i["answer"] not in renders and any(r.startswith(prefix) for r in renders), i


def test_wrong_number_is_not_in_the_prefix(items, by_text):
    for i in items:
        if i["category"] in jd.TARGET_CATEGORIES and i["error_at"] is not None:
            wrong = number_at(i["answer"], i["error_at"])
            prefix = i["answer"][: i["error_at"]]
            assert wrong not in {v for _, v in jd.numbers(prefix)}, i
            if i["source"] != "target":
                assert wrong not in {v for _, v in jd.numbers(i["question"])}, i


def test_labels_agree_with_is_correct(items, by_text):
    for i in items:
        if i["category"] in ("arithmetic", "units", "facts") and i["source"] != "target":
            expected = list(by_text[i["question"]][0].expected)
            assert jd.is_correct(i["answer"], expected) == (i["error_at"] is None), i


def test_target_labels(items, by_text):
    for i in (i for i in items if i["source"] == "target"):
        assert jd.target_error_at(i["answer"], by_text[i["question"]][0]) == i["error_at"]


def test_code_errors_start_a_buggy_line(items):
    for i in (i for i in items if i["category"] == "code"):
        code = re.search(r"```python\n(.*?)\n```", i["answer"], re.S).group(1)
        name = re.match(r"def (\w+)", code).group(1)
        task = next(t for t in jd._CODE if t[1] == name)
        assert jd.passes(code, name, task[3]) == (i["error_at"] is None), i
        if i["error_at"] is not None:
            line_start = i["answer"].rfind("\n", 0, i["error_at"]) + 1
            assert i["answer"][line_start: i["error_at"]].strip() == "" and not i["answer"][i["error_at"]].isspace()


def test_no_e_instructions(items):
    for i in (i for i in items if "letter e" in i["question"]):
        if i["error_at"] is None:
            assert "e" not in i["answer"].lower()
        else:
            word = i["answer"][i["error_at"]:].split()[0]
            assert "e" not in i["answer"][: i["error_at"]].lower() and "e" in word.lower()


@pytest.mark.parametrize("text, expected, ok", [
    ("The answer is 1,250.", ["1250"], True),
    ("1250 m", ["1,250"], True),
    ("6 × 7 = 42, so the result is 42.", ["42"], True),
    ("6 × 7 = 42, so the result is 43.", ["42"], False),
    ("It is 420.", ["42"], False),
    ("3 km is 3000 m.", ["3000 m"], True),
    ("100 °C is 212 °F.", ["212 °F"], True),
    ("5 inches is 12.70 cm", ["12.7"], True),
    ("It is -40 degrees.", ["-40"], True),
    ("No number here.", ["7"], False),
    ("The capital of France is paris.", ["Paris"], True),
    ("A Parisian café.", ["Paris"], False),
    ("There are seven continents.", ["seven", "7"], True),
    ("The formula is H2O2.", ["H2O"], False),
    ("It was painted by Leonardo da Vinci.", ["da Vinci"], True),
])
def test_is_correct(text, expected, ok):
    assert jd.is_correct(text, expected) is ok


@pytest.mark.parametrize("right, wrong, lines, at", [
    ("3 km = 3000 m.", "3 km = 300 m.", False, 7),
    ("The answer is 42.", "The answer is 45.", False, 14),
    ("It is 1,250.", "It is 1,350.", False, 6),
    ("Blue.", "Blue sky.", False, 5),
    ("Blue.", "Green.", False, 0),
    ("The symbol is He.", "The symbol is H.", False, 14),
    ("x\n    return s[::-1]\n```", "x\n    return s[::1]\n```", True, 6),
])
def test_error_offset(right, wrong, lines, at):
    assert jd.error_offset(right, wrong, lines) == at


def test_truncate():
    assert jd.truncate("11 × 2 = 22\n\nThis is ...", finished=False) == "11 × 2 = 22"
    assert jd.truncate("It is 57. Now we add 6", finished=False) == "It is 57."
    assert jd.truncate("It is 57. Now we add 6", finished=True) == "It is 57. Now we add 6"
    assert len(jd.truncate("word " * 100, finished=True)) <= jd.MAX_CHARS


def test_build_is_deterministic_and_matches_the_committed_files(tmp_path, monkeypatch):
    monkeypatch.setattr(jd, "generate_target", lambda texts: pytest.fail(f"would ask the target about {len(texts)} questions"))
    for run in ("a", "b"):
        jd.build(tmp_path / run, target_cache=jd.TARGET_CACHE)
    for name in ("dataset.jsonl", "eval_questions.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes() == (jd.OUT_DIR / name).read_bytes()
