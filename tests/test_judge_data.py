"""The judge-decoding dataset: committed files, error_at semantics, splits, scoring, draft junk and a deterministic build.

No model is loaded: the target's answers and the draft's proposals come from their committed caches."""

import json
import re
from collections import Counter

import pytest

from specviz.training import judge_data as jd
from specviz.training import judge_junk as jj
from specviz.training import judge_questions as jq

KEYS = {"id", "category", "question", "answer", "error_at", "split", "source"}


def load(name):
    return [json.loads(line) for line in (jd.OUT_DIR / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def items():
    return load("dataset.jsonl")


@pytest.fixture(scope="module")
def real(items):
    """The items that are not draft junk."""
    return [i for i in items if i["source"] != "junk"]


@pytest.fixture(scope="module")
def junk(items):
    return [i for i in items if i["source"] == "junk"]


@pytest.fixture(scope="module")
def proposals():
    return {(r["question"], r["answer"]): r for r in load(jd.DRAFT_CACHE.name)}


@pytest.fixture(scope="module")
def by_text():
    by = {}
    for q in jq.questions():
        by.setdefault(q.text, []).append(q)
    return by


def number_at(text, pos):
    return next(v for p, v in jd.numbers(text) if p == pos)


def test_schema_and_counts(items, real):
    assert len(real) >= 450
    assert len({i["id"] for i in items}) == len(items)
    for i in items:
        assert set(i) == KEYS
        assert i["category"] in jq.CATEGORIES and i["split"] in ("train", "heldout")
        assert i["source"] in ("template", "paraphrase", "target", "junk")
        assert isinstance(i["question"], str) and isinstance(i["answer"], str) and i["answer"]
        assert i["error_at"] is None or (isinstance(i["error_at"], int) and 0 <= i["error_at"] < len(i["answer"]))
    cats = Counter(i["category"] for i in real)
    assert all(0.14 < cats[c] / len(real) < 0.26 for c in jq.CATEGORIES), cats
    assert 0.5 <= sum(i["error_at"] is None for i in real) / len(real) <= 0.6
    assert 0.12 < sum(i["split"] == "heldout" for i in items) / len(items) < 0.28
    assert 0.2 < (len(items) - len(real)) / len(items) <= 0.3
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
    for i in (i for i in items if i["source"] in ("template", "paraphrase")):
        renders = [p.format(**q.right) for q in by_text[i["question"]] for p in q.phrasings]
        if i["error_at"] is None:
            assert i["answer"] in renders, i
        else:
            prefix = i["answer"][: i["error_at"]].rstrip()
            assert i["answer"] not in renders and any(r.startswith(prefix) for r in renders), i


def test_wrong_number_is_not_in_the_prefix(real, by_text):
    for i in real:
        if i["category"] in jd.TARGET_CATEGORIES and i["error_at"] is not None:
            wrong = number_at(i["answer"], i["error_at"])
            prefix = i["answer"][: i["error_at"]]
            assert wrong not in {v for _, v in jd.numbers(prefix)}, i
            if i["source"] != "target":
                assert wrong not in {v for _, v in jd.numbers(i["question"])}, i


def test_labels_agree_with_is_correct(items, by_text):
    for i in items:
        if i["category"] in ("arithmetic", "units", "facts") and i["source"] in ("template", "paraphrase"):
            expected = list(by_text[i["question"]][0].expected)
            assert jd.is_correct(i["answer"], expected) == (i["error_at"] is None), i


def test_target_labels(items, by_text):
    for i in (i for i in items if i["source"] == "target"):
        assert jd.target_error_at(i["answer"], by_text[i["question"]][0]) == i["error_at"]


def test_code_errors_start_a_buggy_line(real):
    for i in (i for i in real if i["category"] == "code"):
        code = re.search(r"```python\n(.*?)\n```", i["answer"], re.S).group(1)
        name = re.match(r"def (\w+)", code).group(1)
        task = next(t for t in jq._CODE if t[1] == name)
        assert jq.passes(code, name, task[3]) == (i["error_at"] is None), i
        if i["error_at"] is not None:
            line_start = i["answer"].rfind("\n", 0, i["error_at"]) + 1
            assert i["answer"][line_start: i["error_at"]].strip() == "" and not i["answer"][i["error_at"]].isspace()


def test_no_e_instructions(real):
    for i in (i for i in real if "letter e" in i["question"]):
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


# ----------------------------------------------------------------------------- draft junk


def _base(item, items_by_id):
    base_id, family = item["id"].rsplit("-junk-", 1)
    return items_by_id[base_id], family


def test_junk_counts_and_bases(items, real, junk):
    by_id = {i["id"]: i for i in items}
    families = Counter(i["id"].rsplit("-junk-", 1)[1] for i in junk)
    assert families == {f: round(share * len(real)) for f, share in jj.JUNK.items()}
    assert len({(i["question"], i["answer"]) for i in junk}) == len(junk)
    for i in junk:
        base, _ = _base(i, by_id)
        assert base["source"] != "junk" and base["error_at"] is None
        assert (i["question"], i["category"], i["split"]) == (base["question"], base["category"], base["split"])
        assert i["error_at"] is not None
    assert {i["split"] for i in junk} == {"train", "heldout"}
    assert sum(i["error_at"] == 0 for i in junk) >= 10  # the first answer token, where the decode went wrong


def _junk_fits(family, prefix, tail, at, cut, answer, q):
    """``tail`` is junk of ``family`` after ``prefix`` (a cut of ``answer``) with the error at ``at``."""
    if family == "newline":
        return tail.startswith("\n") and at == len(prefix) and jj._newline_junk(prefix, answer)
    if family == "eos":
        return tail in jj.SPECIALS and at == len(prefix) and not jj._complete(prefix, answer, q)
    if family == "draft":
        _, true, draft_id, piece, fits = cut
        return tail == piece and draft_id != true and fits and bool(piece.strip()) and not piece.startswith("<|")
    word = re.fullmatch(r"( \w+)\1{2,4}", tail)
    return bool(word and word.group(1)[1:] == re.findall(r"\w+", prefix)[-1] or re.fullmatch(r"([.!,?])\1{2,5}", tail))


def test_junk_follows_a_correct_prefix_cut_at_a_token_boundary(items, junk, proposals, by_text):
    by_id = {i["id"]: i for i in items}
    for i in junk:
        base, family = _base(i, by_id)
        cuts = {c[0]: c for c in proposals[base["question"], base["answer"]]["cuts"]}
        text, at = i["answer"], i["error_at"]
        assert not base["answer"].startswith(text), i
        # the cut is error_at, or one earlier when error_at skips the blank of a " word" junk
        fits = [_junk_fits(family, text[:c], text[c:], at, cuts[c], base["answer"], by_text[i["question"]][0])
                for c in (at, at - 1) if c in cuts and base["answer"].startswith(text[:c]) and (c == at or text[c] == " ")]
        assert any(fits), i


def test_draft_cache_covers_every_correct_answer(real, proposals):
    correct = {(i["question"], i["answer"]) for i in real if i["error_at"] is None}
    assert set(proposals) == correct
    for (_, answer), row in proposals.items():
        offsets = [c[0] for c in row["cuts"]]
        assert offsets[0] == 0 and offsets == sorted(set(offsets)) and offsets[-1] < len(answer)


def test_junk_rules():
    q = jq.Question("arithmetic", "What is 6 × 7?", ("The answer is {r}.",), {"r": 42}, (), ("42",))
    answer = "The answer is 42. Let me know!"
    assert not jj._complete("The answer is 4", answer, q) and jj._complete("The answer is 42", answer, q)
    code = jq.Question("code", "f", ("x",), {}, ())
    assert not jj._complete("```python\ndef f", "```python\ndef f():\n```\nDone.", code)
    assert jj._complete("```python\ndef f():\n```", "```python\ndef f():\n```\nDone.", code)
    assert jj._newline_junk("", answer) and jj._newline_junk("The answer", answer)
    assert not jj._newline_junk("The answer is 42.", answer) and not jj._newline_junk("Here:", "Here:\n1. a")
    assert not jj._newline_junk("- Tennis", "- Tennis\n- Golf")
    texts = [answer, "The answer is 42."]
    assert jj._continues(texts, "The answer is ", "4") and jj._continues(texts, "The", " answer")
    assert not jj._continues(texts, "The answer", " the")
    cut = lambda piece, true=0, fits=True: [0, true, 7, piece, fits]  # noqa: E731
    assert jj._draft_junk("The answer", answer, q, texts, cut(" the")) == " the"
    assert jj._draft_junk("The answer is 4", answer, q, texts, cut(".")) == "."  # cuts the number short
    assert jj._draft_junk("The answer is 42", answer, q, texts, cut(",")) is None  # after the answer: may be fine
    assert jj._draft_junk("The answer", answer, q, texts, cut("\n")) is None  # the newline family's job
    assert jj._draft_junk("The answer", answer, q, texts, cut("<|im_end|>")) is None  # the eos family's job
    assert jj._draft_junk("The answer", answer, q, texts, cut(" the", fits=False)) is None
    assert jj._draft_junk("The answer", answer, q, texts, cut(" the", true=7)) is None


def test_build_is_deterministic_and_matches_the_committed_files(tmp_path, monkeypatch):
    monkeypatch.setattr(jd, "generate_target", lambda texts: pytest.fail(f"would ask the target about {len(texts)} questions"))
    monkeypatch.setattr(jd, "draft_proposals_of", lambda pairs: pytest.fail(f"would ask the draft about {len(pairs)} answers"))
    for run in ("a", "b"):
        jd.build(tmp_path / run, target_cache=jd.TARGET_CACHE, draft_cache=jd.DRAFT_CACHE)
    for name in ("dataset.jsonl", "eval_questions.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes() == (jd.OUT_DIR / name).read_bytes()
