"""The judge-decoding dataset (TokenCourt-style) for the offline target SmolLM2-135M-Instruct.

    python -m specviz.training.judge_data build [--out-dir assets/judge] [--seed 1234] [--regenerate-target] [--regenerate-draft]

writes ``dataset.jsonl`` (answers with their first error marked), ``eval_questions.jsonl`` (held-out
verifiable questions for end-to-end accuracy) and refreshes the counts in ``README.md``. Every choice comes
from a seeded RNG, so a build is deterministic; the target's own answers are cached in
``assets/judge/target_answers.jsonl`` and the bundled draft's proposals in ``assets/judge/draft_proposals.jsonl``,
both reused unless ``--regenerate-target`` / ``--regenerate-draft`` (a build from the caches loads no model).

The content lives in ``assets/judge/content.json`` (CONTENT): question and answer phrasings, operator words,
names, word problems, the unit factor table, the fact table, the code tasks (source lines, test cases, buggy
lines), the instruction pools and sentences. This module keeps the logic: generators, error positions, the
numbers of each word problem (keyed by its noun), the target and draft runs and the build. The RNG draws
from the content's lists in their order, so editing the file changes the dataset (rebuild it).

Generation rules
- Item: ``{id, category, question, answer, error_at, split, source}``. ``error_at`` is the character offset
  in ``answer`` of the start of the first wrong number or word (for code: the first non-blank character of
  the first buggy line), or null when the whole answer is correct. Text before it is always correct.
- Each question has answer templates (phrasings: terse, "The answer is X.", worked steps, chatty, restating
  the question) and slot values for its correct answer and for a few wrong variants with exactly one error:
  a wrong result or intermediate (later values are computed from it), a wrong fact entity, a wrong
  conversion factor, a buggy code line or a violated instruction. A wrong answer is a phrasing filled with
  wrong values; ``error_at`` is where it first differs from the same phrasing filled with the right values
  (moved back to the start of that word / number / code line, or past a blank). Wrong numbers never equal a
  number of the question or of its correct worked answers. Phrasing 0 of a question is ``source="template"``,
  the others ``"paraphrase"``; ANSWERS sets, per category, answers per question and the share of correct ones.
- arithmetic: + - × ÷ with small operands and two-step word problems. units: a factor table (×1000, ×60,
  ×2.54, ...) both ways, and °C <-> °F on exact integers. facts: a hand-written table with wrong
  alternatives. code: tiny Python functions, every correct one passes its test cases and every buggy one
  fails them (checked at build). instructions: lists, one-word answers, upper/lower case, no letter "e",
  counting; a wrong answer breaks the constraint at one word.
- source="target": the target's own greedy answers (chat template, batches of 32, left padding,
  ``max_new_tokens=48``) to every arithmetic and units question, cut at the first blank line, at 300
  characters, and back to the last complete sentence when a limit cut it. ``error_at`` is the first number
  that appears neither in the question nor in any correct worked answer of it (operands, intermediates,
  factors, result), even when the final number happens to be right ("5 × 11 is 50. So 5 × 11 = 55." is
  wrong at "50"). Without such a number the answer is positive when ``is_correct`` (its final number is the
  result) and dropped otherwise (it stops before the result). Arithmetic questions never have a result
  equal to one of their own numbers, so a restated operand cannot pass for the result.
- Split by question: 20% of each category's questions are "heldout".
- Scoring (``is_correct``, ``specviz.analysis.quality``): a numeric expected answer must equal the LAST number of the text (thousands
  commas and units ignored: "The answer is 1,250." matches "1250"); any other must occur as a whole word or
  phrase, ignoring case.
- eval_questions.jsonl: easy single-step arithmetic and unit questions that are not dataset questions, plus
  the held-out fact questions; ``expected`` lists the answers ``is_correct`` accepts.

Draft junk (``source="junk"``, appended after the other items, which stay as they are)
- What a weak draft really proposes, which the content errors above never show the judge: a correct answer's
  prefix (of a template, paraphrase or correct target answer; same question, so same split) cut where the
  target's tokenization has a token boundary, the empty prefix included, followed by junk. ``error_at`` is
  ``len(prefix)``, moved past the blank of a " word" junk (the word is the error); the junk's first token is
  the negative one. Id: ``<base item id>-junk-<family>``. JUNK sets each family's count as a share of the
  other items (~30% of the dataset in all); a newline / eos / draft item takes the empty prefix with
  probability JUNK_EMPTY when that cut suits it, else a random suitable cut.
  - newline: "\n" or a blank line, then the rest of the answer, or a trailing run of 2 or 4 newlines; at the
    start of the answer or mid-sentence (not after . ! ? :, a blank, or where the answer breaks the line).
  - eos: "<|im_end|>" or "<|endoftext|>" (the tokenizer turns them into the special ids) before the answer is
    complete: ``is_correct`` fails on the prefix (questions with an expected answer), the code block is not
    closed (code), or letters / digits are still to come (other instructions).
  - draft: the greedy token of the bundled draft ``assets/models/smollm2-draft-s`` after the prefix
    (teacher-forced on the chat prompt + the answer's tokens; cached per answer in draft_proposals.jsonl)
    when it is not the answer's next token, re-tokenizes as itself after the prefix, and is no paraphrase:
    no correct rendering of the question that starts with the prefix goes on with it (blanks ignored) or with
    a word it begins. Blank and special proposals are left to the newline / eos families; punctuation counts
    only before the answer is complete (in code: only when it splits a name or number).
  - loop: right after a whole word, that word repeated 3-5 times (" is is is"; not numbers), or 3-6 of one
    of . ! , ? where the answer goes on with a word.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from specviz.analysis.quality import is_correct, numbers
from specviz.models.paths import ASSETS

OUT_DIR = ASSETS / "judge"
TARGET_CACHE = OUT_DIR / "target_answers.jsonl"
DRAFT_CACHE = OUT_DIR / "draft_proposals.jsonl"
DRAFT_MODEL = ASSETS / "models" / "smollm2-draft-s"
SEED = 1234
CATEGORIES = ("arithmetic", "facts", "units", "code", "instructions")
TARGET_CATEGORIES = ("arithmetic", "units")
HELDOUT = 0.2
MAX_CHARS = 300
# answers per question (mean) and probability that a template answer is correct, per category
ANSWERS = {"arithmetic": (0.9, 0.8), "units": (0.85, 0.8), "facts": (2.2, 0.6), "code": (3.2, 0.6), "instructions": (2.6, 0.6)}

# draft-junk items per family, as a share of the other items (together ~30% of the dataset), and the chance that
# a newline / eos / draft item is cut at the empty prefix (the first answer token) when that cut suits it
JUNK = {"newline": 0.07, "eos": 0.05, "draft": 0.21, "loop": 0.09}
JUNK_EMPTY = 0.25
SPECIALS = ("<|im_end|>", "<|endoftext|>")  # the target tokenizer turns these strings into its end-of-text ids

_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")

# the dataset's content (questions, facts, code tasks, answer phrasings, word lists); this module keeps the logic
CONTENT = ASSETS / "judge" / "content.json"
_CONTENT = json.loads(CONTENT.read_text(encoding="utf-8"))


def _table(rows: list[dict], *fields: str) -> tuple[tuple, ...]:
    """Records of the content file as the tuples the generators unpack (a list field becomes a tuple)."""
    return tuple(tuple(tuple(r[f]) if isinstance(r[f], list) else r[f] for f in fields) for r in rows)


@dataclass
class Question:
    """A question, its answer templates, the slot values of its correct answer and of wrong variants."""

    category: str
    text: str
    phrasings: tuple[str, ...]
    right: dict
    wrongs: tuple[dict, ...]
    expected: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- error positions


def _word_char(s: str, i: int) -> bool:
    """s[i] is part of a word or number (letters, digits, and , or . between two digits)."""
    if not 0 <= i < len(s):
        return False
    return s[i].isalnum() or (s[i] in ",." and 0 < i < len(s) - 1 and s[i - 1].isdigit() and s[i + 1].isdigit())


def error_offset(right: str, wrong: str, lines: bool = False) -> int:
    """Offset in ``wrong`` of the start of the first word (or, with ``lines``, code line) that differs from ``right``."""
    i = next((k for k, (a, b) in enumerate(zip(right, wrong)) if a != b), min(len(right), len(wrong)))
    if lines:
        start = wrong.rfind("\n", 0, i) + 1
        return start + len(wrong[start:]) - len(wrong[start:].lstrip(" "))
    if i > 0 and _word_char(wrong, i - 1) and (_word_char(right, i) or _word_char(wrong, i)):
        while i > 0 and _word_char(wrong, i - 1):
            i -= 1
    while i < len(wrong) and wrong[i].isspace():
        i += 1
    return i


# ----------------------------------------------------------------------------- helpers


def _allowed(text: str, phrasings: tuple[str, ...], right: dict) -> set[float]:
    """Numbers of the question and of every correct worked answer."""
    return {v for t in (text, *(p.format(**right) for p in phrasings)) for _, v in numbers(t)}


def _clean(x: float) -> float | int:
    x = round(x, 2)
    return int(x) if x == int(x) else x


def _off(x: float, rng: random.Random, avoid: set[float]) -> float | int:
    """A plausible wrong value for ``x`` (off by 1, 2 or 10, or two digits swapped), not in ``avoid``."""
    cands = {_clean(x + d) for d in (1, -1, 2, -2, 10, -10)}
    if isinstance(x, int) and x >= 10 and str(x)[-1] != str(x)[-2]:
        cands.add(int(str(x)[:-2] + str(x)[-1] + str(x)[-2]))
    return rng.choice(sorted(c for c in cands if c >= 0 and c != x and c not in avoid))


def _by_text(make, n: int, taken: set[str] = frozenset()) -> list[Question]:
    """``n`` questions from ``make()`` with distinct texts, none of them in ``taken``."""
    out, seen = [], set(taken)
    while len(out) < n:
        q = make()
        if q.text not in seen:
            seen.add(q.text)
            out.append(q)
    return out


def _question(category: str, text: str, phrasings: tuple[str, ...], right: dict, wrongs: list[dict], expected=()) -> Question:
    return Question(category, text, phrasings, right, tuple(w for w in wrongs if w != right), tuple(expected))


# ----------------------------------------------------------------------------- arithmetic

_ARITHMETIC = _CONTENT["arithmetic"]
_FUNCTIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b, "÷": lambda a, b: a // b}
_OPS = {op: (_ARITHMETIC["operator_words"][op], fn) for op, fn in _FUNCTIONS.items()}
_ASK, _SINGLE, _TWO_STEP, _NAMES = (tuple(_ARITHMETIC[k]) for k in ("questions", "answers", "word_problem_answers", "names"))
# the numbers of each word problem of the content file, by its noun: draw (a, b, c), mid(a, b, c), result(a, c, mid)
_WORD_MATH = {
    "apples": (lambda g: (g(2, 30), g(2, 6), g(2, 12)), lambda a, b, c: b * c, lambda a, c, m: a + m),
    "pencils": (lambda g: (g(4, 12), g(2, 6), g(1, 20)), lambda a, b, c: a * b, lambda a, c, m: m - c),
    "pages": (lambda g: (g(5, 30), g(2, 7), g(3, 40)), lambda a, b, c: a * b, lambda a, c, m: m + c),
    "sweets": (lambda g: (lambda b: (b * g(2, 9), b, g(1, 5)))(g(2, 6)), lambda a, b, c: a // b, lambda a, c, m: m + c),
    "passengers": (lambda g: (g(20, 50), g(2, 15), g(1, 15)), lambda a, b, c: a - b, lambda a, c, m: m + c),
    "dollars": (lambda g: (g(5, 10) * 10, g(2, 4), g(2, 9)), lambda a, b, c: b * c, lambda a, c, m: a - m),
}
# question, noun, step 1, step 2, draw, mid, result
_WORD_PROBLEMS = tuple((p["question"], p["noun"], *p["steps"], *_WORD_MATH[p["noun"]]) for p in _ARITHMETIC["word_problems"])


def _single_values(rng: random.Random, small: bool) -> tuple[int, str, int]:
    op = rng.choice(tuple(_OPS))
    hi = 20 if small else 99
    if op == "+":
        return rng.randint(1 if small else 10, hi), op, rng.randint(1 if small else 10, hi)
    if op == "-":
        a = rng.randint(5, hi)
        return a, op, rng.randint(1, a - 1)
    b, q = rng.randint(2, 9 if small else 12), rng.randint(2, 9 if small else 12)
    return (b, op, q) if op == "×" else (b * q, op, b)


def single_step(rng: random.Random, small: bool = False) -> Question:
    """A one-operation question (``small``: operands a 135M model has a fair chance on)."""
    while True:
        a, op, b = _single_values(rng, small)
        word, fn = _OPS[op]
        if fn(a, b) not in (a, b):
            break
    right = {"a": a, "b": b, "op": op, "r": fn(a, b)}
    text = rng.choice(_ASK).format(a=a, b=b, op=op, word=word)
    avoid = _allowed(text, _SINGLE, right)
    wrongs = [{**right, "r": _off(right["r"], rng, avoid)} for _ in range(3)]
    return _question("arithmetic", text, _SINGLE, right, wrongs, [str(right["r"])])


def _two_step(rng: random.Random) -> Question:
    ask, noun, s1, s2, draw, mid_fn, res_fn = rng.choice(_WORD_PROBLEMS)
    while True:
        a, b, c = draw(rng.randint)
        mid = mid_fn(a, b, c)
        if res_fn(a, c, mid) > 0 and res_fn(a, c, mid) not in (a, b, c):
            break
    right = {"a": a, "b": b, "c": c, "mid": mid, "r": res_fn(a, c, mid), "noun": noun}
    text = ask.format(name=rng.choice(_NAMES), a=a, b=b, c=c)
    phrasings = tuple(p.replace("{s1}", s1).replace("{s2}", s2) for p in _TWO_STEP)
    avoid = _allowed(text, phrasings, right)
    wrong_mid = _off(mid, rng, avoid)
    wrongs = [{**right, "mid": wrong_mid, "r": res_fn(a, c, wrong_mid)}, {**right, "r": _off(right["r"], rng, avoid)}]
    return _question("arithmetic", text, phrasings, right, [w for w in wrongs if w["r"] >= 0], [str(right["r"])])


def arithmetic_questions(rng: random.Random) -> list[Question]:
    """48 single-step questions and 32 two-step word problems."""
    return _by_text(lambda: single_step(rng), 48) + _by_text(lambda: _two_step(rng), 32)


# ----------------------------------------------------------------------------- units

_UNIT_CONTENT = _CONTENT["units"]
# singular big unit, plural big unit, plural small unit, factor, wrong factors, largest count
_UNITS = _table(_UNIT_CONTENT["conversions"], "unit", "units", "small_units", "factor", "wrong_factors", "max_count")
_ASK_UNITS, _CONVERT = tuple(_UNIT_CONTENT["questions"]), tuple(_UNIT_CONTENT["answers"])
_TEMPERATURE = {scale: tuple(t["answers"]) for scale, t in _UNIT_CONTENT["temperature"].items()}
_ASK_TEMPERATURE = {scale: tuple(t["questions"]) for scale, t in _UNIT_CONTENT["temperature"].items()}


def conversion(rng: random.Random, easy: bool = False) -> Question:
    """A unit conversion from the factor table (``easy``: big -> small unit, counts 2-9, integer factors)."""
    table = [u for u in _UNITS if isinstance(u[3], int)] if easy else _UNITS
    big, bigs, small, f, bad_factors, top = rng.choice(table)
    k = rng.randint(2, 9 if easy else top)
    down = not easy and rng.random() < 0.4
    x, u1, u2, op, verb = (_clean(k * f), small, bigs, "÷", "divide") if down else (k, bigs, small, "×", "multiply")
    calc = (lambda g: _clean(x / g)) if down else (lambda g: _clean(x * g))
    right = {"x": x, "u1": u1, "u2": u2, "big": big, "small": small, "f": f, "op": op, "verb": verb, "r": calc(f)}
    text = (_ASK_UNITS[0] if easy else rng.choice(_ASK_UNITS)).format(x=x, u1=u1, u2=u2)
    avoid = _allowed(text, _CONVERT, right)
    wrongs = [{**right, "f": g, "r": calc(g)} for g in bad_factors if g not in avoid and calc(g) not in avoid]
    wrongs.append({**right, "r": _off(right["r"], rng, avoid)})
    return _question("units", text, _CONVERT, right, wrongs, [str(right["r"])])


def _temperature(rng: random.Random) -> Question:
    scale = rng.choice("CF")
    k = rng.randint(0, 20)
    if scale == "C":
        x, mid_fn, res_fn = 5 * k, lambda x: _clean(x * 9 / 5), lambda m: m + 32
    else:
        x, mid_fn, res_fn = 32 + 9 * k, lambda x: x - 32, lambda m: _clean(m * 5 / 9)
    right = {"x": x, "mid": mid_fn(x), "r": res_fn(mid_fn(x))}
    text = rng.choice(_ASK_TEMPERATURE[scale]).format(x=x)
    avoid = _allowed(text, _TEMPERATURE[scale], right)
    wrong_mid = _off(right["mid"], rng, avoid)
    wrongs = [{**right, "mid": wrong_mid, "r": res_fn(wrong_mid)}, {**right, "r": _off(right["r"], rng, avoid)}]
    return _question("units", text, _TEMPERATURE[scale], right, wrongs, [str(right["r"])])


def units_questions(rng: random.Random) -> list[Question]:
    """64 factor conversions (both ways) and 16 temperature conversions."""
    return _by_text(lambda: conversion(rng), 64) + _by_text(lambda: _temperature(rng), 16)


# ----------------------------------------------------------------------------- facts

_FACT_CONTENT = _CONTENT["facts"]
_ASK_CAPITAL, _CAPITAL = _FACT_CONTENT["capital_question"], _FACT_CONTENT["capital_statement"]
# question, statement ({a} = answer), answer, wrong alternatives, other accepted spellings
_FACTS = tuple((_ASK_CAPITAL.replace("{country}", c), _CAPITAL.replace("{country}", c), a, w, ())
               for c, a, w in _table(_FACT_CONTENT["capitals"], "country", "capital", "wrong"))
_FACTS += _table(_FACT_CONTENT["facts"], "question", "statement", "answer", "wrong", "aliases")
_STATE = tuple(_FACT_CONTENT["answers"])


def _fact_values(a: str) -> dict:
    return {"a": a, "A": a[0].upper() + a[1:]}


def facts_questions(rng: random.Random) -> list[Question]:
    """One question per row of the fact table."""
    out = []
    for text, statement, answer, wrongs, aliases in _FACTS:
        phrasings = tuple(p.replace("{statement}", statement) for p in _STATE)
        out.append(_question("facts", text, phrasings, _fact_values(answer), [_fact_values(w) for w in wrongs], (answer, *aliases)))
    return out


# ----------------------------------------------------------------------------- code

# question, function name, what it does, test cases ((args), result), implementations (code, bugs (line, buggy line))
_CODE = tuple((t["question"], t["name"], t["does"], tuple((tuple(c["args"]), c["result"]) for c in t["cases"]),
               tuple(("\n".join(i["code"]), tuple((b["line"], b["buggy"]) for b in i["bugs"])) for i in t["implementations"]))
              for t in _CONTENT["code"]["tasks"])
_SNIPPET = tuple(_CONTENT["code"]["answers"])


def passes(code: str, name: str, cases: tuple) -> bool:
    """Whether the function ``name`` defined by ``code`` returns the expected result for every case."""
    env: dict = {}
    try:
        exec(code, env)
        return all(env[name](*args) == want for args, want in cases)
    except Exception:
        return False


def code_questions(rng: random.Random) -> list[Question]:
    """One question per implementation (tasks with two implementations share a question text)."""
    out = []
    for text, name, does, cases, impls in _CODE:
        for code, bugs in impls:
            wrongs = []
            for line, buggy in bugs:
                lines = code.split("\n")
                lines[line] = buggy
                wrongs.append({"code": "\n".join(lines), "name": name, "does": does})
            if not passes(code, name, cases) or any(passes(w["code"], name, cases) for w in wrongs):
                raise ValueError(f"code task {name!r}: a correct version fails or a buggy one passes its cases")
            out.append(_question("code", text, _SNIPPET, {"code": code, "name": name, "does": does}, wrongs))
    return out


# ----------------------------------------------------------------------------- instructions

_INSTRUCTIONS = _CONTENT["instructions"]
# things: (members, things that are not members)
_POOLS = {things: (tuple(p["members"]), tuple(p["not_members"])) for things, p in _INSTRUCTIONS["lists"]["pools"].items()}
_LIST = tuple(_INSTRUCTIONS["lists"]["answers"])
_ONE_WORD = _table(_INSTRUCTIONS["one_word"]["items"], "question", "answer", "wrong", "extra_word")
_UPPER = _table(_INSTRUCTIONS["uppercase"]["items"], "request", "reply")
_LOWER = _table(_INSTRUCTIONS["lowercase"]["items"], "request", "reply")
# topic, sentence without the letter e, a word of it, a replacement that has an e
_NO_E = _table(_INSTRUCTIONS["no_e"]["items"], "topic", "sentence", "word", "replacement")


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _list_values(items: list[str], things: str, n: str) -> dict:
    joined = ", ".join(items[:-1]) + " and " + items[-1]
    return {"items": joined, "Items": _cap(joined), "things": things, "n": n,
            "numbered": "\n".join(f"{i}. {_cap(x)}" for i, x in enumerate(items, 1)), "bullets": "\n".join(f"- {_cap(x)}" for x in items)}


def _list_questions(rng: random.Random) -> list[Question]:
    out = []
    for i, (things, (members, outsiders)) in enumerate(_POOLS.items()):
        for n in (3, 2) if i < 4 else (3,):
            items, word = rng.sample(members, n), _INSTRUCTIONS["lists"]["count_words"][str(n)]
            text = rng.choice(_INSTRUCTIONS["lists"]["questions"]).format(n=word, things=things)
            bad = [items[:j] + [x] + items[j + 1:] for j in range(1, n) for x in (rng.choice(outsiders), items[0])]
            right, wrongs = _list_values(items, things, word), [_list_values(b, things, word) for b in bad]
            out.append(_question("instructions", text, _LIST, right, wrongs))
    return out


def _case_questions(rng: random.Random) -> list[Question]:
    out, upper, lower = [], _INSTRUCTIONS["uppercase"], _INSTRUCTIONS["lowercase"]
    for request, reply in _UPPER:
        words = reply.split(" ")
        bad = [" ".join(words[:k] + [w.lower() for w in words[k:]]) for k in rng.sample(range(len(words)), 2)]
        text = rng.choice(upper["questions"]).format(r=request)
        out.append(_question("instructions", text, tuple(upper["answers"]), {"t": reply}, [{"t": b} for b in bad]))
    for request, reply in _LOWER:
        words = reply.split(" ")
        bad = [" ".join(words[:k] + [_cap(words[k])] + words[k + 1:]) for k in rng.sample(range(len(words)), 2)]
        text = rng.choice(lower["questions"]).format(r=request)
        out.append(_question("instructions", text, tuple(lower["answers"]), {"t": reply}, [{"t": b} for b in bad]))
    return out


def _count_question(rng: random.Random) -> Question:
    a = rng.randint(1, 12)
    seq = list(range(a, a + rng.randint(5, 8)))
    j = rng.randint(1, len(seq) - 2)
    bad = [seq[:j] + seq[j + 1:], seq[:j] + [seq[j - 1]] + seq[j + 1:]]
    text = rng.choice(_INSTRUCTIONS["counting"]["questions"]).format(a=a, b=seq[-1])
    return _question("instructions", text, tuple(_INSTRUCTIONS["counting"]["answers"]), {"seq": ", ".join(map(str, seq))},
                     [{"seq": ", ".join(map(str, b))} for b in bad])


def instruction_questions(rng: random.Random) -> list[Question]:
    """Lists, one-word answers, upper/lower case replies, sentences without "e", counting."""
    out, one_word, no_e = _list_questions(rng), _INSTRUCTIONS["one_word"], _INSTRUCTIONS["no_e"]
    for q, word, wrong, extra in _ONE_WORD:
        text = rng.choice(one_word["questions"]).format(q=q)
        out.append(_question("instructions", text, tuple(one_word["answers"]), {"w": word}, [{"w": wrong}, {"w": f"{word} {extra}"}],
                             (word,)))
    out += _case_questions(rng)
    for topic, sentence, word, replacement in _NO_E:
        out.append(_question("instructions", no_e["question"].format(topic=topic), tuple(no_e["answers"]), {"s": sentence},
                             [{"s": sentence.replace(word, replacement, 1)}]))
    return out + _by_text(lambda: _count_question(rng), 6)


# ----------------------------------------------------------------------------- the dataset

_MAKERS = {"arithmetic": arithmetic_questions, "facts": facts_questions, "units": units_questions, "code": code_questions,
           "instructions": instruction_questions}


def questions(seed: int = SEED) -> list[Question]:
    """Every dataset question, category by category (each category has its own seeded RNG)."""
    return [q for cat in CATEGORIES for q in _MAKERS[cat](random.Random(f"{seed}:{cat}"))]


def splits(qs: list[Question], seed: int = SEED) -> dict[str, str]:
    """Question text -> "train" / "heldout": a seeded HELDOUT share of each category's distinct questions."""
    out = {}
    for cat in CATEGORIES:
        texts = list(dict.fromkeys(q.text for q in qs if q.category == cat))
        random.Random(f"{seed}:split:{cat}").shuffle(texts)
        out.update({t: "heldout" if i < round(HELDOUT * len(texts)) else "train" for i, t in enumerate(texts)})
    return out


def _answers(q: Question, rng: random.Random, n: int, p_correct: float) -> list[tuple[str, int | None, str]]:
    """Up to ``n`` distinct (answer, error_at, source) for ``q``, each correct with probability ``p_correct``."""
    out, seen = [], set()
    for _ in range(10 * n):
        k = rng.randrange(len(q.phrasings))
        values = rng.choice(q.wrongs) if q.wrongs and rng.random() >= p_correct else q.right
        text, right = q.phrasings[k].format(**values), q.phrasings[k].format(**q.right)
        if text not in seen:
            seen.add(text)
            error_at = None if text == right else error_offset(right, text, lines=q.category == "code")
            out.append((text, error_at, "template" if k == 0 else "paraphrase"))
        if len(out) == n:
            break
    return out


def truncate(raw: str, finished: bool) -> str:
    """Cut a target answer at its first blank line and MAX_CHARS; when a limit cut it, keep complete sentences only."""
    text = raw.strip()
    if "\n\n" in text:
        text, finished = text.split("\n\n")[0], True
    if len(text) > MAX_CHARS:
        text, finished = text[:MAX_CHARS], False
    if not finished:
        text = text[: max((m.end() for m in _SENTENCE_END.finditer(text)), default=0)]
    return text.rstrip()


def target_error_at(answer: str, q: Question) -> int | None:
    """Offset of the first number that no correct worked answer uses; else None when the final number is the
    result, and -1 when it is not (the answer stops before the result, or has no number)."""
    allowed = _allowed(q.text, q.phrasings, q.right)
    first = next((pos for pos, v in numbers(answer) if not any(math.isclose(v, a) for a in allowed)), None)
    if first is not None:
        return first
    return None if is_correct(answer, list(q.expected)) else -1


def build_items(qs: list[Question], split: dict[str, str], target: dict[str, dict], seed: int = SEED) -> list[dict]:
    """The dataset rows: template/paraphrase answers of every question, then the target's own answer if kept."""
    items = []
    for cat in CATEGORIES:
        rng, (mean, p_correct) = random.Random(f"{seed}:answers:{cat}"), ANSWERS[cat]
        qids, per_question = {}, Counter()
        for q in (q for q in qs if q.category == cat):
            rows = _answers(q, rng, int(mean) + (rng.random() < mean % 1), p_correct)
            if q.text in target:
                answer = truncate(target[q.text]["answer"], target[q.text]["finished"])
                error_at = target_error_at(answer, q)
                rows += [(answer, error_at, "target")] if answer and error_at != -1 else []
            qid = qids.setdefault(q.text, len(qids))
            for answer, error_at, source in rows:
                items.append({"id": f"{cat}-{qid:03d}-{per_question[q.text]}", "category": cat, "question": q.text, "answer": answer,
                              "error_at": error_at, "split": split[q.text], "source": source})
                per_question[q.text] += 1
    return items


def eval_questions(qs: list[Question], split: dict[str, str], seed: int = SEED) -> list[dict]:
    """Easy arithmetic and unit questions that are not dataset questions, plus the held-out fact questions."""
    rng, taken = random.Random(f"{seed}:eval"), {q.text for q in qs}
    picked = _by_text(lambda: single_step(rng, small=True), 22, taken) + _by_text(lambda: conversion(rng, easy=True), 12, taken)
    picked += [q for q in qs if q.category == "facts" and split[q.text] == "heldout"]
    return [{"id": f"eval-{i:02d}", "category": q.category, "question": q.text, "expected": list(q.expected)} for i, q in enumerate(picked)]


# ----------------------------------------------------------------------------- the target's own answers


def _left_padded(rows: list[list[int]], pad: int):
    import torch

    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def greedy_finish(model, rows: list[list[int]], budgets: list[int], pad: int, stops: set[int], batch: int = 32) -> list[list[int]]:
    """Greedy continuations of the id lists ``rows`` (left-padded batches of similar budgets), each cut at its
    budget and before its first stop id (so a row shorter than its budget stopped)."""
    import torch

    out: list[list[int]] = [[] for _ in rows]
    order = [i for i in sorted(range(len(rows)), key=lambda i: budgets[i]) if budgets[i] > 0]
    for start in range(0, len(order), batch):
        todo = order[start:start + batch]
        ids, mask = _left_padded([rows[i] for i in todo], pad)
        with torch.inference_mode():
            seqs = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=pad,
                                  max_new_tokens=max(budgets[i] for i in todo))[:, ids.shape[1]:].tolist()
        for i, row in zip(todo, seqs):
            row = row[:budgets[i]]
            out[i] = row[:next((k for k, t in enumerate(row) if t in stops), len(row))]
    return out


def teacher_forced_argmax(model, prompt: list[int], answer: list[int]) -> list[int]:
    """``model``'s greedy token for every position of ``answer``, teacher-forced on ``prompt + answer``."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + answer], device=model.device)).logits[0, len(prompt) - 1: -1]
    return logits.argmax(-1).tolist()


def generate_target(texts: list[str], batch: int = 32, max_new_tokens: int = 48) -> list[dict]:
    """The offline target's greedy answers ({question, answer, finished}) through its chat template, in left-padded batches."""
    import torch

    from specviz.models.presets import OFFLINE_PRESET, resolve_preset
    from specviz.models.prompts import encode_prompt, stop_ids_of
    from specviz.runtime.bank import ModelBank

    torch.set_num_threads(1)
    bank, preset = ModelBank(), resolve_preset(OFFLINE_PRESET)
    tok, lm = bank.tokenizer(preset.target), bank.target(preset)
    prompts = [encode_prompt(tok, t, chat=True) for t in texts]
    rows = greedy_finish(lm.model, prompts, [max_new_tokens] * len(texts), tok.pad_token_id, set(stop_ids_of(lm, tok)), batch)
    return [{"question": text, "answer": tok.decode(row, skip_special_tokens=True), "finished": len(row) < max_new_tokens}
            for text, row in zip(texts, rows)]


def target_answers(texts: list[str], cache: Path = TARGET_CACHE, regenerate: bool = False) -> dict[str, dict]:
    """Question -> the target's answer: from the cache, generating the missing ones (all with ``regenerate``);
    the cache is rewritten to hold exactly ``texts`` when it changes."""
    rows = [json.loads(line) for line in cache.read_text().splitlines()] if cache.exists() and not regenerate else []
    have = {r["question"]: r for r in rows if r["question"] in texts}
    missing = [t for t in texts if t not in have]
    if missing:
        start = time.process_time()
        have.update((r["question"], r) for r in generate_target(missing))
        print(f"generated {len(missing)} target answers in {time.process_time() - start:.0f} s of CPU", file=sys.stderr)
    if missing or len(have) != len(rows):
        write_atomic(cache, _jsonl([have[t] for t in texts]))
    return {t: have[t] for t in texts}


# ----------------------------------------------------------------------------- draft junk


def draft_proposals_of(pairs: list[tuple[str, str]]) -> list[dict]:
    """For each (question, correct answer): the bundled draft's greedy token after every prefix of the answer
    that ends at a token boundary of the target's tokenization (chat template, teacher-forced, float32).

    Row: ``{question, answer, cuts}``, ``cuts`` a list of ``[offset, next_id, draft_id, draft_piece, fits]``:
    the prefix ``answer[:offset]`` re-tokenizes to the answer's first tokens, ``next_id`` is the answer's
    token there, ``draft_id`` / ``draft_piece`` the draft's argmax (specials decoded as their text) and
    ``fits`` whether ``prefix + draft_piece`` re-tokenizes to those tokens + ``draft_id``."""
    import torch
    from transformers import AutoModelForCausalLM

    from specviz.models.presets import OFFLINE_PRESET, resolve_preset
    from specviz.models.prompts import encode_prompt
    from specviz.runtime.bank import ModelBank

    torch.set_num_threads(1)
    tok = ModelBank().tokenizer(resolve_preset(OFFLINE_PRESET).target)
    draft = AutoModelForCausalLM.from_pretrained(str(DRAFT_MODEL), dtype=torch.float32).eval()
    out = []
    for question, answer in pairs:
        prompt = encode_prompt(tok, question, chat=True)
        enc = tok(answer, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc.input_ids)
        cuts = []
        for k, ((start, _), true, d) in enumerate(zip(enc.offset_mapping, ids, teacher_forced_argmax(draft, prompt, ids))):
            prefix = answer[:start]
            if tok(prefix, add_special_tokens=False).input_ids != ids[:k]:
                continue  # not a clean cut (inside a multi-byte character, or the prefix re-tokenizes differently)
            piece = tok.decode([d])
            cuts.append([start, true, d, piece, tok(prefix + piece, add_special_tokens=False).input_ids == ids[:k] + [d]])
        out.append({"question": question, "answer": answer, "cuts": cuts})
    return out


def draft_proposals(pairs: list[tuple[str, str]], cache: Path = DRAFT_CACHE, regenerate: bool = False) -> dict[tuple[str, str], dict]:
    """(question, answer) -> its row of :func:`draft_proposals_of`: from the cache, computing the missing ones
    (all with ``regenerate``); the cache is rewritten to hold exactly ``pairs`` when it changes."""
    rows = [json.loads(line) for line in cache.read_text().splitlines()] if cache.exists() and not regenerate else []
    wanted = set(pairs)
    have = {(r["question"], r["answer"]): r for r in rows if (r["question"], r["answer"]) in wanted}
    missing = [p for p in dict.fromkeys(pairs) if p not in have]
    if missing:
        start = time.process_time()
        have.update(((r["question"], r["answer"]), r) for r in draft_proposals_of(missing))
        print(f"asked the draft about {len(missing)} answers in {time.process_time() - start:.0f} s of CPU", file=sys.stderr)
    if missing or len(have) != len(rows):
        write_atomic(cache, _jsonl([have[p] for p in dict.fromkeys(pairs)]))
    return {p: have[p] for p in pairs}


def _complete(prefix: str, answer: str, q: Question) -> bool:
    """The prefix of a correct ``answer`` already answers ``q``: ``is_correct`` for questions with an expected
    answer, a closed code block for code, and otherwise nothing but punctuation / blanks left to say."""
    if not any(c.isalnum() for c in answer[len(prefix):]):
        return True
    if q.expected:
        return is_correct(prefix, list(q.expected))
    return q.category == "code" and prefix.count("```") >= 2


def _continues(texts: list[str], prefix: str, unit: str) -> bool:
    """``prefix + unit`` can still become one of the correct ``texts``: one of them starts with the prefix and
    goes on with ``unit`` (blanks ignored), or with a word that ``unit``'s first word begins."""
    u = unit.strip()
    for t in texts:
        if t.startswith(prefix):
            rest = t[len(prefix):].lstrip()
            if not u or rest.startswith(u):
                return True
            word, other = re.match(r"\w*", u).group(), re.match(r"\w*", rest).group()
            if word and other.startswith(word):
                return True
    return False


def _newline_junk(prefix: str, answer: str) -> bool:
    """A line break here is junk: at the very start, or mid-sentence (after a word, number or comma; not after
    . ! ? : or a blank, and not where the correct answer breaks the line anyway)."""
    if not prefix:
        return True
    return not prefix[-1].isspace() and prefix[-1] not in ".!?:" and not answer[len(prefix):].lstrip(" ").startswith("\n")


def _draft_junk(prefix: str, answer: str, q: Question, texts: list[str], cut: list) -> str | None:
    """The draft's proposal at this cut as junk text, or None when it is the right token, blank or a special
    token (the newline / eos families cover those), a prefix-compatible variant, or punctuation after a
    complete answer (in code: punctuation that does not split a name or number)."""
    _, true, d, piece, fits = cut
    if d == true or not fits or not piece.strip() or piece.startswith("<|"):
        return None  # blanks and end-of-text are the newline and eos families
    if _continues(texts, prefix, piece):
        return None
    if piece.lstrip()[0].isalnum():  # a word or digit that no correct answer continues with
        return piece
    if q.category == "code":  # punctuation: junk when it splits a name or number ("(" may start valid syntax anywhere)
        return piece if prefix[-1:].isalnum() and answer[len(prefix):][:1].isalnum() else None
    return None if _complete(prefix, answer, q) else piece  # punctuation in prose, before the answer is given


def _fits(family: str, prefix: str, answer: str, q: Question, texts: list[str], cut: list) -> bool:
    """Whether a junk item of ``family`` can be cut here."""
    if family == "newline":
        return _newline_junk(prefix, answer)
    if family == "eos":
        return not _complete(prefix, answer, q)
    if family == "draft":
        return _draft_junk(prefix, answer, q, texts, cut) is not None
    return bool(prefix) and prefix[-1].isalnum() and not answer[len(prefix)].isalnum()  # loops follow a whole word / number


def _junk_text(family: str, prefix: str, answer: str, q: Question, texts: list[str], cut: list, rng: random.Random) -> str | None:
    """The junk appended to ``prefix`` (a cut that fits ``family``), or None when the drawn loop is no junk here."""
    rest = answer[len(prefix):]
    if family == "newline":
        return rng.choice(("\n" + rest.lstrip(), "\n\n" + rest.lstrip(), "\n\n", "\n\n\n\n"))
    if family == "eos":
        return rng.choice(SPECIALS)
    if family == "draft":
        return _draft_junk(prefix, answer, q, texts, cut)
    word = " " + re.findall(r"\w+", prefix)[-1]
    if rng.random() < 0.6 and not word.strip().isdigit():  # (" 5 5 5" would start with a bare " " token)
        return None if _continues(texts, prefix, word) else word * rng.randint(3, 5)
    return rng.choice(".!,?") * rng.randint(3, 6) if rest.lstrip()[:1].isalnum() else None


def junk_items(items: list[dict], qs: list[Question], proposals: dict[tuple[str, str], dict], seed: int = SEED) -> list[dict]:
    """Draft-junk negatives: a correct answer's prefix (cut at a token boundary, the empty one included) followed
    by what a weak draft proposes; JUNK sets how many of each family, as a share of ``items``."""
    rng = random.Random(f"{seed}:junk")
    by_text: dict[str, list[Question]] = {}
    for q in qs:
        by_text.setdefault(q.text, []).append(q)
    correct = [i for i in items if i["error_at"] is None]
    out, seen = [], set()
    for family, share in JUNK.items():
        want, made = round(share * len(items)), 0
        for it in rng.sample(correct, len(correct)):
            if made == want:
                break
            q, answer = by_text[it["question"]][0], it["answer"]
            texts = [answer] + [p.format(**k.right) for k in by_text[it["question"]] for p in k.phrasings]
            cuts = [c for c in proposals[it["question"], answer]["cuts"] if _fits(family, answer[:c[0]], answer, q, texts, c)]
            if not cuts:
                continue
            cut = cuts[0] if cuts[0][0] == 0 and rng.random() < JUNK_EMPTY else rng.choice(cuts)
            prefix = answer[:cut[0]]
            junk = _junk_text(family, prefix, answer, q, texts, cut, rng)
            if junk is None or (it["question"], prefix + junk) in seen:
                continue
            seen.add((it["question"], prefix + junk))
            lead = len(junk) - len(junk.lstrip(" "))
            skip = lead if junk.strip() and not junk[lead].isspace() else 0  # " word": the error is the word
            out.append({"id": f"{it['id']}-junk-{family}", "category": it["category"], "question": it["question"],
                        "answer": prefix + junk, "error_at": len(prefix) + skip, "split": it["split"], "source": "junk"})
            made += 1
    return out


# ----------------------------------------------------------------------------- writing


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temp file next to ``path`` and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def summary(items: list[dict], target_line: str) -> str:
    """Markdown table of the counts per category, split and label (✓ correct, ✗ with an error, junk included)."""
    c = Counter((i["category"], i["split"], i["error_at"] is None) for i in items)
    src = Counter((i["category"], i["source"]) for i in items)
    lines = ["| category | train ✓ | train ✗ | heldout ✓ | heldout ✗ | total | target | junk |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cat in (*CATEGORIES, None):
        cats = CATEGORIES if cat is None else (cat,)
        cells = [sum(c[k, s, ok] for k in cats) for s in ("train", "heldout") for ok in (True, False)]
        target, junk = (sum(src[k, s] for k in cats) for s in ("target", "junk"))
        lines.append(f"| {cat or '**all**'} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} | {target} | {junk} |")
    correct = sum(i["error_at"] is None for i in items)
    real = sum(i["source"] != "junk" for i in items)
    return "\n".join(lines) + (f"\n\n{len(items)} items, {correct / len(items):.0%} correct "
                                f"({correct / real:.0%} of the {real} items that are not junk). {target_line}\n")


def _update_readme(path: Path, text: str) -> None:
    """Replace the part of ``path`` between the counts markers, if the file has them."""
    begin, end = "<!-- counts:begin -->\n", "<!-- counts:end -->"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        write_atomic(path, old[: old.index(begin) + len(begin)] + text + old[old.index(end):])


def build(out_dir: Path = OUT_DIR, seed: int = SEED, regenerate_target: bool = False, target_cache: Path = TARGET_CACHE,
          regenerate_draft: bool = False, draft_cache: Path = DRAFT_CACHE) -> str:
    """Write dataset.jsonl and eval_questions.jsonl into ``out_dir`` (and its README counts); return the summary."""
    qs = questions(seed)
    split = splits(qs, seed)
    by_text = {q.text: q for q in qs}
    target = target_answers([q.text for q in qs if q.category in TARGET_CATEGORIES], target_cache, regenerate_target)
    items = build_items(qs, split, target, seed)
    pairs = [(i["question"], i["answer"]) for i in items if i["error_at"] is None]
    items += junk_items(items, qs, draft_proposals(pairs, draft_cache, regenerate_draft), seed)
    right = sum(is_correct(truncate(r["answer"], r["finished"]), list(by_text[t].expected)) for t, r in target.items())
    kept = sum(i["source"] == "target" for i in items)
    line = f"Target answers: {right}/{len(target)} correct ({right / len(target):.0%}); {kept} kept, {len(target) - kept} dropped."
    families = Counter(i["id"].rsplit("-", 1)[1] for i in items if i["source"] == "junk")
    line += (f" Draft junk: {sum(families.values())} items ({sum(families.values()) / len(items):.0%}): "
             + ", ".join(f"{families[f]} {f}" for f in JUNK) + ".")
    text = summary(items, line)
    write_atomic(out_dir / "dataset.jsonl", _jsonl(items))
    write_atomic(out_dir / "eval_questions.jsonl", _jsonl(eval_questions(qs, split, seed)))
    _update_readme(out_dir / "README.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.training.judge_data", description="Build the judge-decoding dataset.")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="rewrite dataset.jsonl, eval_questions.jsonl and the README counts")
    cmd.add_argument("--out-dir", type=Path, default=OUT_DIR)
    cmd.add_argument("--seed", type=int, default=SEED)
    cmd.add_argument("--regenerate-target", action="store_true", help="ask the target again instead of reusing its cached answers")
    cmd.add_argument("--regenerate-draft", action="store_true", help="ask the draft again instead of reusing its cached proposals")
    args = parser.parse_args(argv)
    print(build(args.out_dir, args.seed, args.regenerate_target, regenerate_draft=args.regenerate_draft))
    return 0


if __name__ == "__main__":
    sys.exit(main())
