"""The judge-decoding dataset (TokenCourt-style) for the offline target SmolLM2-135M-Instruct.

    python -m specviz.training.judge_data build [--out-dir assets/judge] [--seed 1234] [--regenerate-target] [--regenerate-draft]

writes ``dataset.jsonl`` (answers with their first error marked), ``eval_questions.jsonl`` (held-out
verifiable questions for end-to-end accuracy) and refreshes the counts in ``README.md``. Every choice comes
from a seeded RNG, so a build is deterministic; the target's own answers are cached in
``assets/judge/target_answers.jsonl`` and the bundled draft's proposals in ``assets/judge/draft_proposals.jsonl``,
both reused unless ``--regenerate-target`` / ``--regenerate-draft`` (a build from the caches loads no model).

The content lives in ``assets/judge/content.json`` (``judge_questions.CONTENT``): question and answer phrasings,
operator words, names, word problems, the unit factor table, the fact table, the code tasks (source lines, test
cases, buggy lines), the instruction pools and sentences. The logic: :mod:`specviz.training.judge_questions` holds
the generators, the numbers of each word problem (keyed by its noun) and the split, :mod:`specviz.training.judge_inference`
the target and draft runs, and this module the error positions, the items, the draft junk, the caches and the build.
The RNG draws from the content's lists in their order, so editing the file changes the dataset (rebuild it).

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

Draft junk (``source="junk"``, appended after the other items): :mod:`specviz.training.judge_junk`.
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
from pathlib import Path

from specviz.analysis.quality import is_correct, numbers
from specviz.models.paths import ASSETS
from specviz.training.judge_inference import draft_proposals_of, generate_target
from specviz.training.judge_junk import JUNK, junk_items
from specviz.training.judge_questions import CATEGORIES, SEED, Question, _allowed, eval_questions, questions, splits

OUT_DIR = ASSETS / "judge"
TARGET_CACHE = OUT_DIR / "target_answers.jsonl"
DRAFT_CACHE = OUT_DIR / "draft_proposals.jsonl"
TARGET_CATEGORIES = ("arithmetic", "units")
MAX_CHARS = 300
# answers per question (mean) and probability that a template answer is correct, per category
ANSWERS = {"arithmetic": (0.9, 0.8), "units": (0.85, 0.8), "facts": (2.2, 0.6), "code": (3.2, 0.6), "instructions": (2.6, 0.6)}

_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")


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


# ----------------------------------------------------------------------------- the items


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


# ----------------------------------------------------------------------------- the caches of the model runs


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
