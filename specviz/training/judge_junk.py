"""Draft junk for the judge-decoding dataset (:mod:`specviz.training.judge_data`): negatives that show the judge what
a weak draft really proposes, which the content errors never do.

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

import random
import re

from specviz.analysis.quality import is_correct
from specviz.training.judge_questions import SEED, Question

# draft-junk items per family, as a share of the other items (together ~30% of the dataset), and the chance that
# a newline / eos / draft item is cut at the empty prefix (the first answer token) when that cut suits it
JUNK = {"newline": 0.07, "eos": 0.05, "draft": 0.21, "loop": 0.09}
JUNK_EMPTY = 0.25
SPECIALS = ("<|im_end|>", "<|endoftext|>")  # the target tokenizer turns these strings into its end-of-text ids


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
