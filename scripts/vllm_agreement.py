"""Cross-engine agreement: every suite prompt, greedy, the offline target, γ = 3, the n-gram drafter and the bundled
draft-m, run by vLLM (a server this script starts, ``scripts/vllm_server.py``) and by specviz's own engine (the same as
``specviz generate --draft D --gamma-policy fixed --gamma 3 --temperature 0 --max-new-tokens N --json``).

Per prompt: whether the token ids are equal, the accepted draft tokens in each engine, and how many of vLLM's steps
line up with one of specviz's (same first token, same accepted count) once vLLM's prefill token is accounted for.
Besides the plain local run, an *aligned* one runs specviz as vLLM runs: from vLLM's first speculative step on (the
prompt and the prefill's token as its context, one token fewer to make), with vLLM's proposal (``ngram-earliest``
for the n-gram drafter; draft-m over its whole vocabulary and in float32, as vLLM's draft model runs), and the drafts
each engine kept are also counted before the last γ tokens of the budget, where the engines' drafting differs by design.

    python scripts/vllm_agreement.py --out results/vllm_agreement   # writes OUT.csv and OUT.md
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from vllm_server import speculative_config  # noqa: E402

import specviz  # noqa: E402
from specviz.analysis.suites import load_suite  # noqa: E402
from specviz.api import bank  # noqa: E402
from specviz.core.errors import ServerError  # noqa: E402
from specviz.models.presets import resolve_draft, resolve_preset  # noqa: E402
from specviz.models.vllm_client import VllmClient  # noqa: E402
from specviz.models.vllm_steps import read_answer  # noqa: E402
from specviz.runtime.config import DecodeConfig  # noqa: E402
from specviz.runtime.prepare import prepare  # noqa: E402

SPECS = ("ngram", "draft-m")
COLUMNS = ["spec", "prompt_id", "tokens_equal", "first_difference", "tokens_vllm", "tokens_specviz", "accepted_vllm",
           "accepted_vllm_emitted", "accepted_vllm_before_end", "accepted_specviz", "accepted_aligned",
           "accepted_aligned_before_end", "tokens_equal_aligned", "steps_vllm", "steps_specviz", "steps_aligned",
           "steps_aligned_run", "unlisted_steps"]
ALIGNED_DRAFT = {"ngram": "ngram-earliest", "draft-m": "draft-m"}
GAMMA = 3


def before_end(starts_at: dict[int, int], max_new: int) -> int:
    """The drafts kept by the steps that start before the last γ tokens of the budget: there specviz's engine drafts
    no further than the token before the limit (the target's verify adds that one) while vLLM drafts its full γ."""
    return sum(n for at, n in starts_at.items() if at < max_new - GAMMA)


def starts(steps: list[dict], at: int = 0) -> dict[int, int]:
    """Each drafting step's first token position (the first step's: ``at``) → its accepted count."""
    out = {}
    for s in steps:
        if s["draft_ids"]:
            out[at] = s["accepted"]
        at += len(s["emitted_ids"])
    return out


def server_runs(spec: str, prompts: list[dict], port: int, max_new: int) -> dict[str, dict]:
    script = [sys.executable, str(ROOT / "scripts" / "vllm_server.py")]
    started = time.monotonic()
    subprocess.run([*script, "start", "--port", str(port), "--spec", spec], check=True)
    print(f"{spec}: server up in {time.monotonic() - started:.0f} s", flush=True)
    ngram = speculative_config(spec, 3, {}) if spec == "ngram" else None  # places the steps vLLM does not list
    try:
        client = VllmClient(f"http://127.0.0.1:{port}")
        model, out = client.model(None), {}
        for p in prompts:
            answer = client.chat(model, p["prompt"], max_tokens=max_new, temperature=0.0, top_p=1.0, seed=0)
            spec_metrics = answer["metrics"]["speculative_decoding"]
            try:
                steps = [s.to_dict() for s in read_answer(answer, speculative_config=ngram).steps]
            except ServerError as exc:  # arrays the tokens do not bear out: totals only
                print(f"{p['id']}: {exc}", flush=True)
                steps = None
            ids = answer["choices"][0]["token_ids"]
            kept = sum(s["accepted"] for s in steps) if steps is not None else spec_metrics["num_accepted_draft_tokens"]
            out[p["id"]] = {"ids": ids, "accepted": spec_metrics["num_accepted_draft_tokens"], "kept": kept,
                            "before_end": before_end(starts(steps), max_new) if steps is not None else kept, "steps": steps,
                            "n_steps": spec_metrics["num_spec_steps"],
                            "unlisted": max(0, len(ids) - 1 - sum(a + 1 for a in spec_metrics["per_step_accepted"] or []))}
    finally:
        subprocess.run([*script, "stop", "--port", str(port)], check=False)
    return out


def local_run(spec: str, prompt: str, max_new: int) -> dict:
    trace = specviz.speculate(prompt, draft=spec, gamma=3, gamma_policy="fixed", temperature=0, max_new_tokens=max_new)
    return trace.to_json()


def aligned_run(spec: str, prompt: str, first: int, max_new: int) -> dict:
    """specviz run as vLLM runs: its context the prompt and the prefill's token ``first``, ``max_new`` − 1 tokens to
    make, vLLM's proposal (:data:`ALIGNED_DRAFT`; a draft model over its whole vocabulary and in float32, as vLLM runs
    it beside a float32 target, where specviz drafts in bfloat16 on a CPU by default)."""
    config = DecodeConfig.from_values(dict(draft=ALIGNED_DRAFT[spec], gamma=GAMMA, gamma_policy="fixed", temperature=0,
                                           max_new_tokens=max_new - 1, full_draft_vocab=spec != "ngram"))
    drafts = None
    if spec != "ngram":
        source = resolve_draft(resolve_preset(config.preset), spec)
        drafts = [(spec, bank().model(source, spec, torch.float32))]
    run = prepare(config, prompt, bank(), drafts=drafts)
    run = replace(run, prompt_ids=run.prompt_ids + [first])
    steps = [e.to_dict() for e in run.events()]
    return {"token_ids": [first] + [t for s in steps for t in s["emitted_ids"]], "steps": steps,
            "accepted": sum(s["accepted"] for s in steps), "before_end": before_end(starts(steps, 1), max_new)}


def aligned_steps(server: dict, steps: list[dict], at: int = 0) -> int | str:
    """How many of vLLM's drafting steps one of ``steps`` (starting at token ``at``) matches: same first token, same
    count kept; blank where vLLM's arrays could not be placed."""
    if server["steps"] is None:
        return ""
    mine = starts(steps, at)
    return sum(mine.get(start) == n for start, n in starts(server["steps"]).items())


def row(spec: str, pid: str, server: dict, local: dict, aligned: dict) -> dict:
    """One prompt's comparison: the plain local run (as ``generate``) and the aligned one against vLLM's."""
    a, b = server["ids"], local["token_ids"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    drafting = sum(1 for s in local["steps"] if s["draft_ids"])
    return {"spec": spec, "prompt_id": pid, "tokens_equal": a == b, "first_difference": "" if first is None else first,
            "tokens_vllm": len(a), "tokens_specviz": len(b), "accepted_vllm": server["accepted"],
            "accepted_vllm_emitted": server["kept"], "accepted_vllm_before_end": server["before_end"],
            "accepted_specviz": local["metrics"]["accepted"], "accepted_aligned": aligned["accepted"],
            "accepted_aligned_before_end": aligned["before_end"],
            "tokens_equal_aligned": aligned["token_ids"] == a, "steps_vllm": server["n_steps"], "steps_specviz": drafting,
            "steps_aligned": aligned_steps(server, local["steps"]), "steps_aligned_run": aligned_steps(server, aligned["steps"], 1),
            "unlisted_steps": server["unlisted"]}


def within(x: int, y: int, share: float = 0.10) -> bool:
    return abs(x - y) <= share * max(x, y, 1)


def summary(rows: list[dict], max_new: int, version: str) -> str:
    lines = [f"# specviz against vLLM {version}: the same target, draft and γ", "",
             f"Every suite prompt ({len({r['prompt_id'] for r in rows})}), greedy, {max_new} new tokens, γ = 3, the offline "
             "target in float32 on both engines; vLLM through its chat endpoint with per-request speculation "
             "(`--per-request-spec-decode-metrics detailed`), specviz's own engine with the same draft "
             "(`--gamma-policy fixed --gamma 3 --temperature 0`). Made by `python scripts/vllm_agreement.py`; "
             "docs/vllm.md explains the differences.", "",
             "*Aligned*: specviz from vLLM's first speculative step on (the prompt and the prefill's token as its context), "
             "drafting with vLLM's proposal (the aligned draft: vLLM's n-gram rule; draft-m over its whole vocabulary and in "
             "float32, as vLLM runs it; specviz drafts in bfloat16 on a CPU by default).", "",
             "*Emitted*: vLLM's accepted drafts that it emitted (at max_tokens or a stop token its last step drafts its "
             f"full γ and counts every draft it accepted, emitted or not). *Before the end*: the drafts kept by the steps "
             f"that start before the last γ = {GAMMA} tokens of the budget, in each engine: there specviz's engine drafts "
             "no further than the token before the limit (the target's verify adds that one), vLLM its full γ.", "",
             "| draft | aligned draft | prompts | token ids equal | accepted, vLLM | accepted, specviz | within 10 % | "
             "accepted and emitted, vLLM | accepted, specviz aligned | token ids equal, aligned | within 10 %, aligned | "
             "before the end, vLLM | before the end, aligned | within 10 %, before the end | vLLM steps matched: "
             "specviz / aligned / all | prompts with steps vLLM does not list |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec in SPECS:
        rs = [r for r in rows if r["spec"] == spec]
        listed = [r for r in rs if r["steps_aligned"] != ""]
        lines.append(f"| {spec} | {ALIGNED_DRAFT[spec]} | {len(rs)} | {sum(r['tokens_equal'] for r in rs)} | "
                     f"{sum(r['accepted_vllm'] for r in rs)} | {sum(r['accepted_specviz'] for r in rs)} | "
                     f"{sum(within(r['accepted_vllm'], r['accepted_specviz']) for r in rs)} | "
                     f"{sum(r['accepted_vllm_emitted'] for r in rs)} | {sum(r['accepted_aligned'] for r in rs)} | "
                     f"{sum(r['tokens_equal_aligned'] for r in rs)} | "
                     f"{sum(within(r['accepted_vllm_emitted'], r['accepted_aligned']) for r in rs)} | "
                     f"{sum(r['accepted_vllm_before_end'] for r in rs)} | {sum(r['accepted_aligned_before_end'] for r in rs)} | "
                     f"{sum(within(r['accepted_vllm_before_end'], r['accepted_aligned_before_end']) for r in rs)} | "
                     f"{sum(r['steps_aligned'] for r in listed)} / {sum(r['steps_aligned_run'] for r in listed)} / "
                     f"{sum(r['steps_vllm'] for r in listed)} | {sum(r['unlisted_steps'] > 0 for r in rs)} |")
    lines += ["", "## Per prompt", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.csv and OUT.md")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--per-category", type=int, default=0, help="prompts per category (0: all)")
    ap.add_argument("--port", type=int, default=8013)
    a = ap.parse_args()
    prompts = load_suite("all", a.per_category)
    rows, version = [], ""
    for spec in SPECS:
        served = server_runs(spec, prompts, a.port, a.max_new_tokens)
        for p in prompts:
            local = local_run(spec, p["prompt"], a.max_new_tokens)
            aligned = aligned_run(spec, p["prompt"], served[p["id"]]["ids"][0], a.max_new_tokens)
            rows.append(row(spec, p["id"], served[p["id"]], local, aligned))
            print(json.dumps(rows[-1]), flush=True)
        version = version or vllm_version()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    a.out.with_suffix(".md").write_text(summary(rows, a.max_new_tokens, version))
    print(f"wrote {a.out}.csv and {a.out}.md")
    return 0


def vllm_version() -> str:
    """The version of the vLLM package this checkout's venv holds (the server is stopped by now)."""
    out = subprocess.run([str(ROOT / ".venv-vllm" / "bin" / "python"), "-c", "import vllm; print(vllm.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "(unknown version)"


if __name__ == "__main__":
    sys.exit(main())
