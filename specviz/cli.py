"""Command line: ``python -m specviz generate|bench``. User mistakes print one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specviz.core.errors import ConfigError, ModelLoadError
from specviz.models.presets import OFFLINE_PRESET
from specviz.runtime.config import DecodeConfig
from specviz.training import judge_cli


class UsageError(Exception):
    """Raised instead of argparse's own exit so every mistake reads the same way."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def add_decode_options(p: argparse.ArgumentParser) -> None:
    d = DecodeConfig()
    p.add_argument("--preset", default=d.preset, help=f"model preset (default {OFFLINE_PRESET})")
    p.add_argument("--method", default=None, help="ar | sd (default sd)")
    p.add_argument("--draft", default=None, help="draft name of the preset, 'ngram', a hub id or a local dir")
    p.add_argument("--chain", type=_names, default=[], help="polybasic chain, fastest first (target implied last)")
    p.add_argument("--level-gamma", type=int, default=d.level_gamma, help="draft length of each lower chain level")
    p.add_argument("--select", type=_names, default=[], help="drafts to choose from per step")
    p.add_argument("--gamma", type=int, default=d.gamma, help="draft length (fixed or initial)")
    p.add_argument("--gamma-policy", default=d.gamma_policy)
    p.add_argument("--accept", default=d.accept)
    p.add_argument("--judge-threshold", type=float, default=d.judge_threshold)
    p.add_argument("--lenience", type=float, default=d.lenience)
    p.add_argument("--topk", type=int, default=d.topk)
    p.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=d.top_p)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--full-draft-vocab", action="store_true",
                   help="drafts score the whole vocabulary, not only the frequent tokens of their draft_vocab.json")
    p.add_argument("--dtype", default=d.dtype, help="target dtype: auto (float32 on CPU, exact; bfloat16 on CUDA) | float32 | bfloat16")


def config_from_args(a: argparse.Namespace) -> DecodeConfig:
    return DecodeConfig(
        preset=a.preset, method=a.method or "sd", draft=a.draft, chain=a.chain, level_gamma=a.level_gamma, select=a.select, gamma=a.gamma,
        gamma_policy=a.gamma_policy, accept=a.accept, judge_threshold=a.judge_threshold, lenience=a.lenience,
        topk=a.topk, temperature=a.temperature, top_p=a.top_p, seed=a.seed, max_new_tokens=a.max_new_tokens,
        chat=not a.no_chat, dtype=a.dtype, full_draft_vocab=a.full_draft_vocab,
    ).validate()


def build_parser() -> Parser:
    ap = Parser(prog="python -m specviz", description="Speculative decoding you can watch.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    g = sub.add_parser("generate", help="generate a continuation and report every step")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", type=Path)
    add_decode_options(g)
    g.add_argument("--json", action="store_true", help="print the full JSON result")
    b = sub.add_parser("bench", help="interleaved benchmark over the prompt suites")
    b.add_argument("--suite", default="all", help="'all' or comma-separated categories")
    b.add_argument("--configs", default="standard", help="benchmark set: standard | policies | selection | chains | judge | judge-head")
    b.add_argument("--per-category", type=int, default=0, help="prompts per category (0 = all)")
    b.add_argument("--max-new-tokens", type=int, default=96)
    b.add_argument("--out", type=Path, default=Path("results/bench"))
    b.add_argument("--only", type=_names, default=[], help="only these rows (comma-separated labels; the first is the reference)")
    b.add_argument("--repeats", type=int, default=1, help="interleaved rounds per prompt; each row keeps its fastest run")
    judge_cli.register(sub)
    c = sub.add_parser("chain-advisor", help="measure the preset's models, rank chains by Lemma 3.1, run the best")
    c.add_argument("--preset", default=OFFLINE_PRESET)
    c.add_argument("--prompts", type=int, default=3, help="prompts to measure on (one per category)")
    c.add_argument("--gamma", type=int, default=DecodeConfig.gamma, help="draft length of every level")
    c.add_argument("--max-new-tokens", type=int, default=48)
    c.add_argument("--top", type=int, default=3, help="how many of the best-ranked chains to run")
    f = sub.add_parser("fit-predictor", help="fit the prompt-feature acceptance predictor used by --select")
    f.add_argument("--prompts", type=int, default=0, help="warm-up prompts to fit on (round-robin over categories; 0: all 24)")
    return ap


def read_prompt(a: argparse.Namespace) -> str:
    if a.prompt is not None:
        return a.prompt
    try:
        return a.prompt_file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read --prompt-file {a.prompt_file}: {exc.strerror}") from None


def cmd_generate(a: argparse.Namespace) -> int:
    from specviz.analysis.result import run_to_result
    from specviz.runtime.bank import ModelBank
    from specviz.runtime.prepare import prepare

    config = config_from_args(a)
    run = prepare(config, read_prompt(a), ModelBank())
    result = run_to_result(run)
    if a.json:
        print(json.dumps(result))
    else:
        m = result["metrics"]
        print(result["text"])
        print(f"\n[{m['new_tokens']} tokens in {m['wall_s']:.2f}s = {m['tokens_per_s']:.1f} tok/s; "
              f"mean accepted length {m['mean_accept_len']:.2f}; acceptance rate {m['accept_rate']:.2f}]", file=sys.stderr)
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from specviz.bench.harness import CONFIG_SETS, run_benchmark

    if a.configs not in CONFIG_SETS:
        raise ConfigError(f"--configs must be one of {', '.join(CONFIG_SETS)}, got '{a.configs}'")
    configs = CONFIG_SETS[a.configs](a.max_new_tokens)
    if a.only:
        unknown = [label for label in a.only if label not in {c.label for c in configs}]
        if unknown:
            raise ConfigError(f"--only: no row {unknown[0]!r} in set '{a.configs}'; rows: {', '.join(c.label for c in configs)}")
        configs = sorted((c for c in configs if c.label in a.only), key=lambda c: a.only.index(c.label))
    if a.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {a.repeats}")
    run_benchmark(a.suite, a.configs, a.per_category, a.max_new_tokens, a.out, configs, a.repeats)
    return 0


def cmd_fit_predictor(a: argparse.Namespace) -> int:
    from specviz.training.predictor_fit import fit_predictor

    fit_predictor(a.prompts)
    return 0


def cmd_chain_advisor(a: argparse.Namespace) -> int:
    from specviz.analysis.advisor import advise, format_rows

    if not (1 <= a.prompts <= 6 and 1 <= a.gamma <= 16 and 1 <= a.max_new_tokens <= 512 and a.top >= 1):
        raise ConfigError("chain-advisor needs 1 <= --prompts <= 6, 1 <= --gamma <= 16, 1 <= --max-new-tokens <= 512, --top >= 1")
    print(format_rows(advise(a.preset, a.prompts, a.gamma, a.max_new_tokens, a.top)))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        a = build_parser().parse_args(argv)
        commands = {"generate": cmd_generate, "bench": cmd_bench, "fit-predictor": cmd_fit_predictor, "judge": judge_cli.run,
                    "chain-advisor": cmd_chain_advisor}
        return commands[a.command](a)
    except (UsageError, ConfigError, ModelLoadError) as exc:
        print(f"specviz: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specviz: interrupted", file=sys.stderr)
        return 130
