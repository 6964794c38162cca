"""The questions of the judge-decoding dataset: the per-category generators with their constants and content tables,
the train/held-out split and the held-out evaluation questions. Each category draws from its own seeded RNG over
``assets/judge/content.json`` in the content's order; :mod:`specviz.training.judge_data` documents the generation
rules and builds the dataset from these questions."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from specviz.analysis.quality import numbers
from specviz.models.paths import ASSETS

SEED = 1234
CATEGORIES = ("arithmetic", "facts", "units", "code", "instructions")
HELDOUT = 0.2

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


def eval_questions(qs: list[Question], split: dict[str, str], seed: int = SEED) -> list[dict]:
    """Easy arithmetic and unit questions that are not dataset questions, plus the held-out fact questions."""
    rng, taken = random.Random(f"{seed}:eval"), {q.text for q in qs}
    picked = _by_text(lambda: single_step(rng, small=True), 22, taken) + _by_text(lambda: conversion(rng, easy=True), 12, taken)
    picked += [q for q in qs if q.category == "facts" and split[q.text] == "heldout"]
    return [{"id": f"eval-{i:02d}", "category": q.category, "question": q.text, "expected": list(q.expected)} for i, q in enumerate(picked)]
