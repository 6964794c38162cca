"""Command line: ``python -m specviz generate|bench|judge|chain-advisor|fit-predictor``. User mistakes print one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from specviz.analysis.advisor import LEVEL_GAMMA
from specviz.bench.configs import CONFIG_SETS
from specviz.core.errors import ConfigError, ModelLoadError
from specviz.core.policy import MAX_GAMMA
from specviz.models.presets import OFFLINE_PRESET
from specviz.models.vllm_client import DEFAULT_TIMEOUT_S
from specviz.runtime.config import APP_MAX_NEW_TOKENS, DecodeConfig, option
from specviz.training import judge_cli


class UsageError(Exception):
    """Raised instead of argparse's own exit so every mistake reads the same way."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """One option per DecodeConfig field, with its help and choices; a bool field is a flag that flips its default."""
    types = {f.name: f.type for f in fields(DecodeConfig)}
    for name, s in DecodeConfig.settings().items():
        default = getattr(DecodeConfig, name, None)
        help = s.help + (f" ({' | '.join(s.options())})" if s.choices is not None else "")
        if types[name] == "bool" and default:
            p.add_argument(f"--no-{name.replace('_', '-')}", dest=name, action="store_false", help=f"do not {help}")
        elif types[name] == "bool":
            p.add_argument(option(name), action="store_true", help=help)
        elif types[name] == "list[str]":
            p.add_argument(option(name), type=_names, default=[], help=help + ", comma-separated")
        else:
            kind = {"int": int, "float": float}.get(types[name], str)
            shown = s.default_text or default
            p.add_argument(option(name), type=kind, default=default, help=help + ("" if shown is None else f"; default {shown}"))


def config_from_args(a: argparse.Namespace) -> DecodeConfig:
    return DecodeConfig(**{name: getattr(a, name) for name in DecodeConfig.settings()}).validate()


def build_parser() -> Parser:
    ap = Parser(prog="python -m specviz", description="Speculative decoding you can watch.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    g = sub.add_parser("generate", help="generate a continuation and report every step")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="a file holding the prompt")
    add_decode_options(g)
    g.add_argument("--json", action="store_true", help="print the full JSON result")
    g.add_argument("--trace-out", type=Path, help="save the run (with its AR baseline) as a trace file (load it in the app or Python)")
    g.add_argument("--html", type=Path, help="save the run (with its AR baseline) as one self-contained HTML page")
    g.add_argument("--server", metavar="URL", help="run on a vLLM server (http://host:port) with its speculation and "
                   "per-request metrics (--per-request-spec-decode-metrics detailed), instead of this process's engine")
    g.add_argument("--model", metavar="NAME", help="with --server: the served model (default: the server's only one)")
    g.add_argument("--speculative-config", type=_json_object, metavar="JSON",
                   help="with --server: the server's --speculative-config, kept in the trace (an n-gram server's steps "
                   "without a draft are placed by its rule)")
    g.add_argument("--server-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"with --server: seconds to wait for each answer; default {DEFAULT_TIMEOUT_S:g}")
    b = sub.add_parser("bench", help="interleaved benchmark over the prompt suites")
    b.add_argument("--suite", default="all", help="'all', comma-separated categories, or 'judge-eval' (the held-out judge questions)")
    b.add_argument("--configs", default="standard", help=f"benchmark set: {' | '.join(CONFIG_SETS)}")
    b.add_argument("--per-category", type=int, default=0, help="prompts per category (0 = all)")
    b.add_argument("--max-new-tokens", type=int, default=96, help="tokens per run")
    b.add_argument("--out", type=Path, default=Path("out/bench"),
                   help="writes OUT.csv (a row per prompt and configuration) and OUT.md (summary tables)")
    b.add_argument("--only", type=_names, default=[], help="only these rows (comma-separated labels; the first is the reference)")
    b.add_argument("--repeats", type=int, default=1, help="interleaved rounds per prompt; each row keeps its fastest run")
    judge_cli.register(sub)
    c = sub.add_parser("chain-advisor", help="measure the preset's models, rank chains by Lemma 3.1, run the best")
    c.add_argument("--preset", default=OFFLINE_PRESET, help="the preset whose target and drafts are measured")
    c.add_argument("--prompts", type=int, default=3, help="prompts to measure on, one per category (1–6)")
    c.add_argument("--gamma", type=int, default=LEVEL_GAMMA, help=f"draft length of every level (1–{MAX_GAMMA})")
    c.add_argument("--max-new-tokens", type=int, default=48, help=f"tokens per run (1–{APP_MAX_NEW_TOKENS})")
    c.add_argument("--top", type=int, default=3, help="how many of the best-ranked chains to run (≥ 1)")
    f = sub.add_parser("fit-predictor", help="fit the prompt-feature acceptance predictor used by --select")
    f.add_argument("--prompts", type=int, default=0, help="warm-up prompts to fit on (round-robin over categories; 0: all 24)")
    f.add_argument("--out", type=Path, required=True,
                   help="the file to write (the bundled one, read by --select: assets/models/acceptance_predictor.json)")
    return ap


def read_prompt(a: argparse.Namespace) -> str:
    if a.prompt is not None:
        return a.prompt
    try:
        return a.prompt_file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read --prompt-file {a.prompt_file}: {exc.strerror}") from None


def cmd_generate(a: argparse.Namespace) -> int:
    if a.server is None and (a.model is not None or a.speculative_config is not None):
        raise ConfigError(f"{'--model' if a.model is not None else '--speculative-config'} describes a server: use it with --server")
    trace = server_run(a) if a.server is not None else local_run(a)
    for path, write in ((a.trace_out, trace.save), (a.html, trace.to_html)):
        if path is not None:
            try:
                write(path)
            except OSError as exc:
                raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    if a.json:
        print(json.dumps(trace.to_json()))
    else:
        m = trace.metrics
        print(trace.text)
        print(f"\n[{m['new_tokens']} tokens in {m['wall_s']:.2f}s = {m['tokens_per_s']:.1f} tok/s; "
              f"mean accepted length {m['mean_accept_len']:.2f}; acceptance rate {m['accept_rate']:.2f}]", file=sys.stderr)
    return 0


SERVER_REPLACES = ("draft", "chain", "select", "tree_nodes", "target")
"""Local settings a server run cannot take: the server's own speculation replaces them."""


def server_run(a: argparse.Namespace):
    from specviz.api.server import server_trace

    defaults = DecodeConfig()
    given = [name for name in SERVER_REPLACES if getattr(a, name) != getattr(defaults, name)]
    if given:
        raise ConfigError(f"--server runs the server's speculation: {option(given[0])} is for local runs")
    return server_trace(read_prompt(a), a.server, a.model, config_from_args(a), a.server_timeout, a.speculative_config)


def local_run(a: argparse.Namespace):
    from specviz.api.trace import trace_of
    from specviz.runtime.bank import ModelBank
    from specviz.runtime.prepare import baseline_config, prepare

    config, prompt, bank = config_from_args(a), read_prompt(a), ModelBank()
    run = prepare(config, prompt, bank)
    trace = trace_of(prompt, run.plan, list(run.events()), run.machine)
    if (a.trace_out or a.html) and config.method == "sd":  # a trace file holds its AR baseline
        ar = prepare(baseline_config(config), prompt, bank)
        trace.baseline = trace_of(prompt, ar.plan, list(ar.events()), ar.machine)
    return trace


def cmd_bench(a: argparse.Namespace) -> int:
    from specviz.bench.harness import run_benchmark

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

    fit_predictor(a.prompts, a.out)
    return 0


def cmd_chain_advisor(a: argparse.Namespace) -> int:
    from specviz.analysis.advisor import advise, format_rows

    if not (1 <= a.prompts <= 6 and 1 <= a.gamma <= MAX_GAMMA and 1 <= a.max_new_tokens <= APP_MAX_NEW_TOKENS and a.top >= 1):
        raise ConfigError(f"chain-advisor needs 1 <= --prompts <= 6, 1 <= --gamma <= {MAX_GAMMA}, "
                          f"1 <= --max-new-tokens <= {APP_MAX_NEW_TOKENS}, --top >= 1")
    print(format_rows(advise(a.preset, a.prompts, a.gamma, a.max_new_tokens, a.top)))
    return 0


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # stderr holds the one-line error or the run's summary, nothing else
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
