"""Lossless on the real offline target: suite prompts, every drafter as a chain of γ ∈ {1, 3, 6}, token trees of 4, 8
and 16 nodes and a polybasic chain, 64 new tokens, token for token the same as transformers' greedy generate (and so
is the AR baseline).

By default every second suite prompt (four of each category's eight) runs every drafter at one γ, rotating through
{1, 3, 6} so that every (drafter, γ) pair meets 8 prompts, and every second of those also runs the trees and the
polybasic chain at one size, rotating, so that ``make test`` stays inside its time. SPECVIZ_FULL_EXACTNESS=1 runs
every prompt with every γ and every tree size; SPECVIZ_EXACTNESS_DRAFTS=a,b limits the drafters to those (and leaves
out the trees and the polybasic chain).

SPECVIZ_EXACTNESS_LOG=PATH also writes a log: a header naming the settings, the commit (``git rev-parse HEAD``,
marked when the work tree has uncommitted changes; "unknown" outside a git checkout) and the machine, then one line
per prompt and a summary. Committed logs are written this way, so each says what code and hardware it covers; a
committed log whose settings line differs is not overwritten."""

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from specviz.analysis.suites import load_suite
from specviz.models.loading import describe_hardware
from specviz.models.presets import PRESETS
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_steps import refuse_other_settings  # noqa: E402

pytestmark = pytest.mark.slow
N = 64
DRAFTS = [d for d in os.environ.get("SPECVIZ_EXACTNESS_DRAFTS", "").split(",") if d] or [*PRESETS["smollm2-offline"].drafts, "ngram"]


def generate_reference(run) -> list[int]:
    ids = torch.tensor([run.prompt_ids])
    with torch.inference_mode():
        out = run.target.lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=N,
                                           eos_token_id=run.stop_ids, pad_token_id=run.stop_ids[0])
    return out[0, ids.shape[1]:].tolist()


GAMMAS = (1, 3, 6)
TREES = (("head", "dynamic"), ("draft-m", "static"), ("ngram", "dynamic"))
TREE_NODES = (4, 8, 16)
POLYBASIC = ["ngram", "draft-s", "draft-m"]
FULL = os.environ.get("SPECVIZ_FULL_EXACTNESS") == "1"
LOG = os.environ.get("SPECVIZ_EXACTNESS_LOG", "")
ROOT = Path(__file__).resolve().parent.parent


def code_commit() -> str:
    """HEAD's commit, marked when tracked files differ from it; "unknown" where git or the checkout is missing."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} (with uncommitted changes)" if dirty else head


def log_header() -> str:
    """What a log covers: the command's settings, the commit and the machine."""
    settings = " ".join(f"{k}={os.environ[k]}" for k in ("SPECVIZ_FULL_EXACTNESS", "SPECVIZ_EXACTNESS_DRAFTS") if k in os.environ)
    gammas = "γ ∈ {1, 3, 6} on every prompt" if FULL else "every second prompt, one γ of (1, 3, 6) per prompt and drafter, rotating"
    trees = ("" if os.environ.get("SPECVIZ_EXACTNESS_DRAFTS") else
             f"; trees {', '.join(f'{d} {k}' for d, k in TREES)} and the polybasic chain {','.join(POLYBASIC)}: "
             + ("nodes ∈ {4, 8, 16} (chain γ ∈ {1, 3, 6}) on every prompt" if FULL else "one size per second prompt run, rotating"))
    return (f"# {settings + ' ' if settings else ''}.venv/bin/python -m pytest tests/test_exact_real.py\n"
            f"# run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit: {code_commit()}\n"
            f"# machine: {describe_hardware()}\n"
            f"# offline target in float32, greedy, {N} new tokens; AR and drafters {', '.join(DRAFTS)}: {gammas}{trees}; "
            "each must equal transformers' generate token for token\n")


@pytest.fixture(scope="module")
def exactness_log():
    """The log's file (None unless SPECVIZ_EXACTNESS_LOG is set): header first, a summary line last."""
    if not LOG:
        yield None
        return
    header = log_header()
    refuse_other_settings(LOG, header.splitlines()[3])  # a committed log made with other settings stays
    counts = {"passed": 0, "failed": 0}
    with open(LOG, "w") as f:
        f.write(header)
        f.flush()
        yield f, counts
        f.write(f"# {counts['passed']} prompts passed, {counts['failed']} failed\n")


def shaped_runs(index: int) -> list[tuple[str, DecodeConfig]]:
    """The token trees and the polybasic chain the ``index``-th prompt run runs (none with SPECVIZ_EXACTNESS_DRAFTS)."""
    if os.environ.get("SPECVIZ_EXACTNESS_DRAFTS") or not (FULL or index % 2 == 0):
        return []
    sizes = range(3) if FULL else [index // 2 % 3]
    fixed = partial(DecodeConfig, gamma_policy="fixed", max_new_tokens=N)
    runs = [(f"{draft} {kind} tree {TREE_NODES[i]}", fixed(draft=draft, tree_nodes=TREE_NODES[i], tree_kind=kind))
            for draft, kind in TREES for i in sizes]
    return runs + [(f"chain {','.join(POLYBASIC)} γ={GAMMAS[i]}", fixed(chain=POLYBASIC, gamma=GAMMAS[i])) for i in sizes]


SUITE = load_suite("all")
PROMPTS = SUITE if FULL else SUITE[::2]


@pytest.mark.parametrize("index, item", list(enumerate(PROMPTS)), ids=lambda x: x["id"] if isinstance(x, dict) else "")
def test_all_methods_match_generate(bank, exactness_log, index, item):
    ar = prepare(DecodeConfig(method="ar", max_new_tokens=N), item["prompt"], bank)
    reference = generate_reference(ar)
    outputs = {"ar": [t for e in ar.events() for t in e.emitted_ids]}
    for d, draft in enumerate(DRAFTS):
        for gamma in GAMMAS if FULL else [GAMMAS[(index + d) % len(GAMMAS)]]:
            run = prepare(DecodeConfig(method="sd", draft=draft, gamma=gamma, gamma_policy="fixed", max_new_tokens=N), item["prompt"], bank)
            outputs[f"{draft} γ={gamma}"] = [t for e in run.events() for t in e.emitted_ids]
    for label, config in shaped_runs(index):
        outputs[label] = [t for e in prepare(config, item["prompt"], bank).events() for t in e.emitted_ids]
    mismatches = {name: out for name, out in outputs.items() if out != reference}
    if exactness_log:
        f, counts = exactness_log
        counts["failed" if mismatches else "passed"] += 1
        f.write(f"{item['id']}: {'FAILED ' + ', '.join(mismatches) if mismatches else 'passed'} ({', '.join(outputs)})\n")
        f.flush()
    assert mismatches == {}
