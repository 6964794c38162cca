"""The engine's speed before and after a change, measured interleaved in one run.

Two worker processes, one per source tree (a git worktree of the earlier commit, and this checkout), each keep their
models loaded. Every prompt runs every configuration of the chosen bench sets in both, back to back, alternating
which goes first; after a warm-up of each configuration in each. Speed is new tokens over the wall time of the decode
(prefill included, model loading and prompt encoding not), and each configuration's row is the median over prompts of
after / before. Greedy runs must emit the same tokens in both trees, which the ``same tokens`` column counts.

    python scripts/engine_before_after.py --base 2a98449 --sets heads trees --per-category 1 --max-new-tokens 64 \\
        --out results/engine_before_after
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.analysis.suites import load_suite, load_warmup  # noqa: E402
from specviz.bench.configs import CONFIG_SETS  # noqa: E402
from specviz.models.loading import describe_hardware  # noqa: E402

WORKER = r"""
import json, sys, time
from specviz.runtime.bank import ModelBank
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import prepare

bank = ModelBank()
for line in sys.stdin:
    job = json.loads(line)
    run = prepare(DecodeConfig(**job["config"]), job["prompt"], bank)
    start = time.perf_counter()
    ids = [t for e in run.events(record=False) for t in e.emitted_ids]
    print(json.dumps({"seconds": time.perf_counter() - start, "ids": ids}), flush=True)
"""


class Worker:
    """One source tree's decodes, in a process of its own (its ``specviz`` imported from ``tree``), at torch's thread count
    ``threads`` (None: chosen as it runs, as the engine does by default)."""

    def __init__(self, tree: Path, threads: int | None = None):
        env = {"PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin",
               **({"SPECVIZ_TORCH_THREADS": str(threads)} if threads else {})}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, config: dict, prompt: str) -> dict:
        self.proc.stdin.write(json.dumps({"config": config, "prompt": prompt}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("a worker exited; its error is above")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def configs(sets: list[str], max_new_tokens: int) -> dict[str, dict]:
    """The engine rows of the bench sets (transformers' assisted generation is no engine), by label."""
    rows = [c for name in sets for c in CONFIG_SETS[name](max_new_tokens) if not c.transformers]
    return {c.label: asdict(c.decode) for c in rows}


def measure(base: str, sets: list[str], per_category: int, max_new_tokens: int, threads: int | None = None) -> pd.DataFrame:
    rows, labelled = [], configs(sets, max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before_tree), base], check=True,
                       capture_output=True)
        workers = {"before": Worker(before_tree, threads), "after": Worker(ROOT, threads)}
        try:
            warm = load_warmup(1)[0]["prompt"]
            for config in labelled.values():
                for worker in workers.values():
                    worker.run(config, warm)
            for i, row in enumerate(load_suite("all", per_category)):
                order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
                for label, config in labelled.items():
                    out = {side: workers[side].run(config, row["prompt"]) for side in order}
                    rows.append({"prompt_id": row["id"], "config": label, "same_tokens": out["before"]["ids"] == out["after"]["ids"],
                                 **{f"{side}_tok_s": len(o["ids"]) / o["seconds"] for side, o in out.items()}})
                    print(f"{row['id']:>12} {label:<40} {rows[-1]['after_tok_s'] / rows[-1]['before_tok_s']:.3f}", flush=True)
        finally:
            for worker in workers.values():
                worker.close()
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)], capture_output=True)
    return pd.DataFrame(rows)


def table(df: pd.DataFrame) -> str:
    lines = ["| configuration | before tok/s | after tok/s | median after / before | same tokens |", "|---|---|---|---|---|"]
    for label, g in df.groupby("config", sort=False):
        ratio = statistics.median(g["after_tok_s"] / g["before_tok_s"])
        lines.append(f"| {label} | {g['before_tok_s'].median():.1f} | {g['after_tok_s'].median():.1f} | {ratio:.3f}× | "
                     f"{int(g['same_tokens'].sum())}/{len(g)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit before the change")
    ap.add_argument("--sets", nargs="+", default=["heads", "trees"], choices=sorted(CONFIG_SETS))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, help="torch's thread count in both trees (default: chosen as they run)")
    ap.add_argument("--out", type=Path, required=True, help="path stem: writes STEM.csv and STEM.md")
    a = ap.parse_args()
    command = "python scripts/engine_before_after.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    md = a.out.with_suffix(".md")
    if md.exists() and f"Reproduce: `{command}`" not in md.read_text():
        raise SystemExit(f"{md} was made with other settings; write elsewhere (--out)")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    df = measure(a.base, a.sets, a.per_category, a.max_new_tokens, a.threads)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out.with_suffix(".csv"), index=False)
    md.write_text(
        f"# Engine speed before ({a.base}) and after ({head}) the change\n\n"
        f"Sets {', '.join(a.sets)}; {df['prompt_id'].nunique()} prompts, {a.max_new_tokens} new tokens, greedy, interleaved "
        f"(both trees on each prompt back to back, alternating first); torch threads "
        f"{a.threads or 'chosen as each tree runs'}. Machine: {describe_hardware()}.\n\n"
        f"{table(df)}\n\nReproduce: `{command}`\n")
    print(table(df))


if __name__ == "__main__":
    main()
