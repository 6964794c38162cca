"""Outcome-labelled draft decisions: the judge's real decisions, labelled by what accepting them does.

    python -m specviz.training.judge_decisions build [--extra 120] [--out assets/judge/decisions.jsonl]
    python -m specviz.training.judge_decisions build --on-policy 100 [--threshold 0.5]   # after training a head on the above
    python -m specviz.training.judge_decisions build --on-policy 100 --round 2           # after retraining on round 1

The TokenCourt-style items of :mod:`specviz.training.judge_data` teach which *phrasings* are right; this file teaches
what the judge actually faces while decoding: a token the draft proposes where the target would have written
another. For each question with a checkable answer (the dataset's train-split arithmetic, unit and fact
questions, plus ``--extra`` fresh easy arithmetic and unit questions that are neither dataset nor
``eval_questions.jsonl`` questions, so the end-to-end accuracy questions stay unseen):

1. the target answers greedily (chat template, ``MAX_NEW_TOKENS``): the reference;
2. the bundled draft (as the engine loads it) proposes its greedy token after every prefix of the reference
   (teacher-forced); each proposal that differs from the reference token is a *decision* (``PER_QUESTION``
   of them, drawn at random, are kept);
3. the target greedily finishes ``prefix + proposal`` to the same token budget, and the decision is labelled
   acceptable (1) when the finished text gives the reference's answer: the same last number for numeric
   questions, the expected word for fact questions (only those the target answers correctly are used).

Row: ``{id, category, question, answer, answer_ids, label, split, source: "decision"}``; ``answer_ids`` are
the reference prefix's token ids followed by the proposal, and only that last token is labelled (``answer``
is its text, for reading). A seeded ``HELDOUT`` share of the questions is ``split="heldout"``.

``--on-policy N`` appends a DAgger round: on N random questions, judge decoding with the bundled head runs
as in the benchmark, and every token it accepted beyond exact verification becomes a decision (id
``on-policy-…``), labelled by step 3. Those are the off-trajectory states (loops, derailed sentences) that
teacher-forced proposals never reach. Each ``--round`` draws its own questions and ids (``on-policy2-…``).
``--draft NAME`` makes judge decoding draft with another bundled draft in that round (ids ``on-policy3-head-…``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from specviz.analysis.quality import as_number, is_correct, numbers
from specviz.training import judge_data as jd
from specviz.training import judge_inference as ji
from specviz.training import judge_questions as jq

OUT = jd.OUT_DIR / "decisions.jsonl"
MAX_NEW_TOKENS = 48  # the judge benchmark's budget
PER_QUESTION = 12  # decisions labelled per question at most (a random sample): more questions beat more cuts of one


def training_questions(extra: int, seed: int = jq.SEED) -> list[jq.Question]:
    """Train-split arithmetic, unit and fact questions of the dataset, then ``extra`` fresh easy ones (unit
    conversions up to half of them, as many as are left, then arithmetic) that are neither dataset nor eval questions."""
    qs = jq.questions(seed)
    split = jq.splits(qs, seed)
    taken = {q.text for q in qs} | {e["question"] for e in jq.eval_questions(qs, split, seed)}
    picked = [q for q in qs if q.category in ("arithmetic", "units", "facts") and split[q.text] == "train" and q.expected]
    rng = random.Random(f"{seed}:decisions")
    fresh = _fresh(lambda: jq.conversion(rng, easy=True), extra // 2, taken)  # only ~70 easy conversions exist
    fresh += _fresh(lambda: jq.single_step(rng, small=True), extra - len(fresh), taken)
    return list({q.text: q for q in picked + fresh}.values())


def _fresh(make, n: int, taken: set[str], tries: int = 50) -> list[jq.Question]:
    """Up to ``n`` questions from ``make()`` with distinct texts not in ``taken`` (which grows), in ``tries * n`` draws."""
    out = []
    for _ in range(tries * n):
        q = make()
        if len(out) == n:
            break
        if q.text not in taken:
            taken.add(q.text)
            out.append(q)
    return out


def answer_key(text: str, q: jq.Question) -> str | None:
    """What must survive a decision: the last number for numeric questions, else the expected word if present."""
    if as_number(q.expected[0]) is not None:
        found = numbers(text)
        return f"{found[-1][1]:g}" if found else None
    return q.expected[0] if is_correct(text, list(q.expected)) else None


def judged_cuts(bank, question: str, threshold: float, draft: str = "draft-s") -> list[tuple[list[int], int]]:
    """(answer prefix, token) of every token judge decoding (the bundled head at ``threshold``, drafting with
    ``draft``) accepted beyond exact verification while answering ``question``."""
    from specviz.runtime.config import DecodeConfig
    from specviz.runtime.prepare import prepare

    config = DecodeConfig(method="sd", draft=draft, gamma=4, gamma_policy="fixed", accept="judge", judge_threshold=threshold,
                          max_new_tokens=MAX_NEW_TOKENS)
    answer, cuts = [], []
    for e in prepare(config, question, bank).events():
        cuts += [(answer + e.draft_ids[:i], e.draft_ids[i]) for i, why in enumerate(e.accept_reasons) if why == "judge"]
        answer += e.emitted_ids
    return cuts


def on_policy_questions(n: int, total: int, seed: int, round_: int) -> list[int]:
    """Indices of the ``n`` questions (of ``total``) that DAgger round ``round_`` decodes; round 1 keeps its
    original draw."""
    suffix = "" if round_ == 1 else f":{round_}"
    return sorted(random.Random(f"{seed}:decisions:on-policy{suffix}").sample(range(total), n))


def build(extra: int, out: Path = OUT, seed: int = jq.SEED, on_policy: int = 0, threshold: float = 0.5, round_: int = 1,
          on_policy_draft: str = "draft-s") -> str:
    """Write the decisions of :func:`training_questions` to ``out``; return a one-line summary. With
    ``on_policy`` > 0, keep the rows already in ``out`` and add the tokens judge decoding accepted (beyond exact
    verification) on that many questions drawn at random: the states the judge's own choices lead to (one
    DAgger round), which teacher-forced proposals never show."""
    from specviz.models.presets import OFFLINE_PRESET, resolve_draft, resolve_preset
    from specviz.models.prompts import encode_prompt, stop_ids_of
    from specviz.runtime.bank import ModelBank

    bank, preset = ModelBank(), resolve_preset(OFFLINE_PRESET)
    tok, target = bank.tokenizer(preset.target), bank.target(preset)
    draft = bank.model(resolve_draft(preset, "draft-s"), "draft-s").model
    stops, pad = set(stop_ids_of(target, tok)), tok.pad_token_id
    qs = training_questions(extra, seed)
    heldout = set(random.Random(f"{seed}:decisions:split").sample(range(len(qs)), round(jq.HELDOUT * len(qs))))
    rng = random.Random(f"{seed}:decisions:cuts")
    picked = on_policy_questions(on_policy, len(qs), seed, round_) if on_policy else range(len(qs))
    kind = "decision" if not on_policy else "on-policy" if round_ == 1 else f"on-policy{round_}"
    if on_policy and on_policy_draft != "draft-s":
        kind += f"-{on_policy_draft}"
    rows = [json.loads(line) for line in out.read_text().splitlines()] if on_policy else []
    kept = len(rows)
    prompts = [encode_prompt(tok, qs[k].text, chat=True) for k in picked]
    refs = ji.greedy_finish(target.model, prompts, [MAX_NEW_TOKENS] * len(prompts), pad, stops)
    for done, (k, prompt, ref) in enumerate(zip(picked, prompts, refs), 1):
        q = qs[k]
        key = answer_key(tok.decode(ref, skip_special_tokens=True), q)
        if key is None or not ref:
            continue  # nothing to preserve: no number, or a fact the target gets wrong
        if on_policy:
            cuts = judged_cuts(bank, q.text, threshold, on_policy_draft)
        else:
            cuts = [(ref[:t], d) for t, d in enumerate(ji.teacher_forced_argmax(draft, prompt, ref)) if d != ref[t]]
            cuts = sorted(rng.sample(cuts, min(PER_QUESTION, len(cuts))))
        tails = ji.greedy_finish(target.model, [prompt + a + [d] for a, d in cuts],
                              [0 if d in stops else MAX_NEW_TOKENS - len(a) - 1 for a, d in cuts], pad, stops)
        for n, ((a, d), tail) in enumerate(zip(cuts, tails)):
            text = tok.decode(a + [d] + tail, skip_special_tokens=True)
            rows.append({"id": f"{kind}-{k:03d}-{n:02d}", "category": q.category,
                         "question": q.text, "answer": tok.decode(a + [d]), "answer_ids": a + [d],
                         "label": int(answer_key(text, q) == key), "split": "heldout" if k in heldout else "train",
                         "source": "decision"})
        print(f"{done}/{len(prompts)} questions, {len(rows) - kept} decisions", file=sys.stderr, flush=True)
    jd.write_atomic(out, jd._jsonl(rows))
    new = rows[kept:]
    good = sum(r["label"] for r in new)
    return f"{len(new)} decisions from {len(prompts)} questions ({good} acceptable, {len(new) - good} harmful) -> {out}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specviz.training.judge_decisions", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="rewrite decisions.jsonl (asks the target and the draft; minutes on a CPU)")
    b.add_argument("--extra", type=int, default=120, help="fresh easy arithmetic/unit questions on top of the dataset's")
    b.add_argument("--out", type=Path, default=OUT)
    b.add_argument("--seed", type=int, default=jq.SEED)
    b.add_argument("--on-policy", type=int, default=0, metavar="N",
                   help="add the tokens judge decoding accepts on N random questions to the existing file")
    b.add_argument("--threshold", type=float, default=0.5, help="δ of the on-policy judge decoding")
    b.add_argument("--round", type=int, default=1, help="DAgger round of --on-policy (each draws other questions)")
    b.add_argument("--draft", default="draft-s", help="the draft judge decoding drafts with in --on-policy rounds")
    a = p.parse_args(argv)
    start = time.perf_counter()
    print(build(a.extra, a.out, a.seed, a.on_policy, a.threshold, a.round, a.draft), f"in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
