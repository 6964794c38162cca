"""The front door and the docs: the README stays short, no page narrates the project's history, the generated parts
(benchmark tables, reference sections) match their sources, and what generation cannot make is checked here: every
flag, preset, ``specviz.*`` name, variable, script and results path a page names exists, every cited results file has
the command that made it beside it, every file under results/ has a command in ``scripts/run_benchmarks.sh``, and no
documented command writes a committed results file without naming it."""

import argparse
import ast
import contextlib
import dataclasses
import fnmatch
import importlib
import importlib.util
import io
import re
import runpy
import shlex
import subprocess
import sys
import unittest.mock
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_steps  # noqa: E402
import doc_figures  # noqa: E402
import render_reference  # noqa: E402

from specviz import cli  # noqa: E402
from specviz.core.env import ENV  # noqa: E402
from specviz.models.presets import PRESETS  # noqa: E402
from specviz.runtime import config  # noqa: E402

GENERATED = re.compile(r"<!-- (table|ref):([\w-]+) -->\n.*?<!-- /\1:\2 -->", re.S)
COMMAND = re.compile(r"^(?:\.venv/bin/)?python|^make |^bash |^(?:[A-Z_]+=\S*\s+)+|^scripts/")
RESULTS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.is_file())


def prose(page: Path) -> str:
    """A page without its generated blocks (those are checked against their sources)."""
    return GENERATED.sub("", page.read_text())


def paragraphs(text: str) -> list[str]:
    """Blocks between blank lines; a fenced code block is one block, blank lines and all."""
    out, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if current:
                out.append("\n".join(current))
            current = []
        else:
            current.append(line)
    return out + (["\n".join(current)] if current else [])


def commands(text: str) -> list[str]:
    """Commands a text shows: inline code and lines of fenced blocks that start the way a command starts."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    lines = [line.strip() for block in re.findall(r"```\w*\n(.*?)```", text, re.S) for line in block.splitlines()]
    return [c for c in spans + lines if COMMAND.search(c.strip())]


def test_the_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_narrates_history(page):
    text = prose(page)
    assert not re.search(r"\bsessions? \d+|backed out|DESIGN\.md|\bissue #?\d+|\btoday'?s?\b|\bnow reads\b|\bbefore them\b|"
                         r"\bhas changed since\b|\bused to\b|\bwas renamed\b", text, re.I), page.name


@pytest.mark.parametrize("script", ["render_tables.py", "render_reference.py"])
def test_generated_sections_match_their_sources(script):
    result = subprocess.run([sys.executable, f"scripts/{script}", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_new_decode_setting_fails_the_check_until_the_pages_are_regenerated(monkeypatch, tmp_path):
    new = ("brand_new", int, config.setting(7, "a setting added by a test", low=0, high=9))
    extended = dataclasses.make_dataclass("DecodeConfig", [new], bases=(config.DecodeConfig,))
    monkeypatch.setattr(config, "DecodeConfig", extended)
    monkeypatch.setattr(cli, "DecodeConfig", extended)
    page = tmp_path / "app.md"
    page.write_text((ROOT / "docs" / "app.md").read_text())
    assert render_reference.main(["--check"], pages=[page]) == 1
    assert render_reference.main([], pages=[page]) == 0
    assert render_reference.main(["--check"], pages=[page]) == 0
    assert "| `--brand-new` | `7` | 0–9 | a setting added by a test |" in page.read_text()


def test_the_reference_refuses_an_undocumented_step_key(monkeypatch):
    monkeypatch.setattr(render_reference.StepEvent, "KEYS", {k: v for k, v in render_reference.StepEvent.KEYS.items() if k != "tree"})
    with pytest.raises(SystemExit, match="tree"):
        render_reference.SECTIONS["json-step"]()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [link for link in links if "://" not in link and not (page.parent / link).exists()]
    assert missing == [], page.name


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= parser_flags(sub)
    return flags


def known_flags() -> set[str]:
    """The CLI's options, every option a script defines, and the few of other tools the pages show."""
    scripts = {f for p in (ROOT / "scripts").glob("*") for f in re.findall(r"[\"'\s](--[a-z][\w-]*)", p.read_text())}
    sources = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "specviz").rglob("*.py")]
    modules = {f for p in sources for f in re.findall(r"\"(--[a-z][\w-]*)", p.read_text())}
    others = {"--no-deps", "--no-build-isolation", "--index-url", "--upgrade", "--check", "--change", "--fix", "--help"}
    return parser_flags(cli.build_parser()) | scripts | modules | others


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_a_page_names_exists(page):
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", prose(page)))
    assert sorted(named - known_flags()) == [], page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_preset_a_page_names_exists(page):
    text = prose(page)
    named = re.findall(r"--preset[ =]([a-z][\w.-]*)|preset=[\"']([\w.-]+)|SPECVIZ_PRESET=([\w.-]+)|"
                       r"`([a-z][\w.-]*)` preset|preset `([a-z][\w.-]*)`", text)
    assert sorted({n for group in named for n in group if n} - set(PRESETS)) == [], page.name


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_specviz_name_and_path_a_page_names_exists(page):
    text = page.read_text()
    names = {n.rstrip(".") for n in re.findall(r"(?<![\w/.-])specviz(?:\.[A-Za-z_]\w*)+", text)} - {"specviz.json"}  # a file name
    paths = {p.rstrip(".") for p in re.findall(r"(?<![\w/])((?:specviz|scripts|tests|assets|examples)/[\w./-]*\w)", text)}
    assert sorted(n for n in names if not resolves(n)) == [], page.name
    assert sorted(p for p in paths if not (ROOT / p).exists() and not any(ROOT.glob(p + ".*"))) == [], page.name


def variables_in_use() -> set[str]:
    sources = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").glob("*")]
    return set(ENV) | {v for p in sources for v in re.findall(r"SPECVIZ_[A-Z_]+", p.read_text())}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_variable_a_page_names_is_read(page):
    named = set(re.findall(r"SPECVIZ_[A-Z_]+[A-Z]", page.read_text()))
    assert sorted(named - variables_in_use()) == [], page.name


def test_code_reads_the_environment_only_through_the_registry():
    """Every variable specviz reads is in ``specviz.core.env.ENV`` (so the docs' table, rendered from it, is complete)."""
    offenders = []
    for path in [*(ROOT / "specviz").rglob("*.py"), ROOT / "app.py"]:
        if path.name == "env.py":
            continue
        tree = ast.parse(path.read_text())
        writes = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "setdefault"}
        offenders += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") and isinstance(n.value, ast.Name)
                      and n.value.id == "os" and id(n) not in writes]
    assert offenders == []


def cited_results(text: str) -> list[str]:
    """Committed files a text cites (``results/x.{csv,md}`` and globs expanded)."""
    found = []
    for ref in re.findall(r"results/[\w./{},*-]*[\w}*]", text):
        for path in expand(ref):
            found += [f for f in RESULTS if f == path or f.startswith(path + ".") or fnmatch.fnmatch(f, path)
                      or f.startswith(path.rstrip("/") + "/")]
    return sorted(set(found))


def expand(ref: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", ref)
    return [ref] if not m else [p for alt in m[1].split(",") for p in expand(ref[:m.start()] + alt + ref[m.end():])]


def written_by_a_command(ref: str, text: str) -> bool:
    return bool(re.search(rf"(?:--out\s+|>>?\s*|tee\s+|LOG=){re.escape(ref)}", text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_results_path_a_page_names_exists(page):
    text = page.read_text()
    missing = [ref for ref in set(re.findall(r"results/[\w./{},*-]*[\w}*]", text))
               if not any(cited_results(p) for p in expand(ref)) and not written_by_a_command(ref, text)]
    assert sorted(missing) == [], page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_results_file_has_its_command_beside_it(page):
    """A paragraph citing a committed results file, or one next to it, shows a command (the one that made it)."""
    blocks = paragraphs(page.read_text())
    bare = []
    for i, block in enumerate(blocks):
        if cited_results(block) and not any(commands(b) for b in blocks[max(0, i - 1): i + 2]):
            bare.append(block[:120])
    assert bare == [], page.name


def test_every_results_file_has_a_step_or_an_elsewhere_line():
    steps, elsewhere = bench_steps.benchmark_steps()
    assert [f for f in RESULTS if bench_steps.made_by(f, steps, elsewhere) is None] == []


def test_the_steps_name_what_they_write():
    steps, _ = bench_steps.benchmark_steps()
    assert {"heads", "trees", "trees-all-prompts", "linear-kernels", "judge-eval", "ui-browser", "load-test"} <= set(steps)
    assert all(bench_steps.outputs(c) for c in steps.values()), steps
    assert bench_steps.outputs(steps["predictor"]) == ["assets/models/acceptance_predictor.json"]


def test_make_bench_all_writes_no_committed_asset():
    """The default steps (``make bench-all``) write nothing under assets/; a step that does runs only when named."""
    steps, _ = bench_steps.benchmark_steps()
    assert set(bench_steps.default_steps()) <= set(steps)
    assert [(n, o) for n in bench_steps.default_steps() for o in bench_steps.outputs(steps[n]) if o.startswith("assets/")] == []
    assert "STEPS=${STEPS:-" in bench_steps.BENCH_SCRIPT.read_text() and "bash scripts/run_benchmarks.sh" in (ROOT / "Makefile").read_text()


def writers() -> dict[str, str]:
    """Scripts that write a results file: their name and whether their ``--out`` has a default."""
    out = {}
    for path in (ROOT / "scripts").glob("*.py"):
        m = re.search(r"add_argument\(\s*\"--out\"([^)]*)\)", path.read_text())
        if m:
            out[f"scripts/{path.name}"] = m[1]
    return out


def test_no_writer_defaults_into_results():
    """A bare command never overwrites a committed file: no ``--out`` defaults under results/ (gpu_check.py writes a new
    dated file into results/cuda/)."""
    defaults = {name: args for name, args in writers().items() if "default" in args and "results" in args}
    assert list(defaults) == ["scripts/gpu_check.py"] or list(defaults) == []
    for parser in [cli.build_parser()]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    for a in sub._actions:
                        if "--out" in a.option_strings:
                            assert not str(a.default or "").startswith("results"), a


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_documented_command_writes_a_committed_file_without_naming_it(page):
    bad = []
    for command in commands(prose(page)):
        for script in writers():
            if script in command and "gpu_check" not in script and "--out" not in command and "--help" not in command:
                bad.append(command)
        if re.search(r"specviz (?:bench|judge eval)\b", command) and "--out" not in command and "results/" in command:
            bad.append(command)
    assert bad == [], page.name


def test_a_script_refuses_to_overwrite_a_committed_result_made_with_other_settings():
    header = (ROOT / "results" / "ui_queue_poll.txt").read_text().splitlines()
    bench_steps.refuse_other_settings("results/ui_queue_poll.txt", *header[:1], header[2])  # its own settings: allowed
    with pytest.raises(SystemExit, match="refusing to overwrite results/ui_queue_poll.txt: .*other settings.*gamma 1"):
        bench_steps.refuse_other_settings("results/ui_queue_poll.txt", header[0], header[2].replace("gamma 3", "gamma 1"))
    bench_steps.refuse_other_settings("results/not_committed.txt", "anything")  # a new file: nothing to protect


@pytest.mark.parametrize("script, committed_file", [("measure_ui", "results/ui_measure.txt"), ("measure_load", "results/load_test.txt")])
def test_the_ui_and_load_measurements_refuse_their_committed_results_made_otherwise(script, committed_file):
    """Both files were written by a shell redirect (no header naming the command and settings); the scripts that make
    them now take ``--out`` and refuse, before measuring anything, to replace them."""
    module = importlib.import_module(script)
    with pytest.raises(SystemExit, match=f"refusing to overwrite {committed_file}: .*other settings"):
        module.main(4, committed_file) if script == "measure_ui" else module.main(committed_file)


@pytest.mark.parametrize("page", doc_figures.PAGES, ids=lambda p: p.name)
def test_every_figure_is_held_by_its_source_or_the_code(page):
    """Numbers in prose and hand-made tables are found in a results or assets file their section cites; restated
    constants equal the code's (``scripts/doc_figures.py``)."""
    assert doc_figures.problems(page) == []


def test_a_figure_edited_by_hand_fails_and_names_its_line(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, old, new in [("teaching.md", "run at 1.49× AR", "run at 1.59× AR"), ("methods.md", "capped at 0.95", "capped at 0.9"),
                           ("benchmarks.md", "4: 1.018× for", "4: 1.418× for"),
                           ("methods.md", "prior by two pseudo", "prior by three pseudo"), ("app.md", "every 50 ms", "every 40 ms"),
                           ("benchmarks.md", "58.7            55.8", "58.7            56.8")]:
        text = (ROOT / "docs" / name).read_text()
        assert old in text and doc_figures.problems(ROOT / "docs" / name) == []
        (docs / name).write_text(text.replace(old, new))
        line = text[:text.index(old)].count("\n") + 1
        found = doc_figures.problems(docs / name)
        assert len(found) == 1 and found[0].startswith(f"docs/{name}:{line}: "), found
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text().replace("sdk_version: 6.31.0", "sdk_version: 6.30.0"))
    assert [p.split(": ")[0] for p in doc_figures.problems(readme)] == ["README.md:7"]
    bare = docs / "bare.md"
    bare.write_text("# A page\n\nThe head runs at 1.23× AR.\n")
    assert doc_figures.problems(bare) == ["docs/bare.md:3: '1.23×' names no source (cite the results file it comes from in its section)"]


def test_a_figure_computed_from_committed_files_or_held_by_a_linked_table_fails_when_edited(tmp_path):
    """drafts.md's shard counts are computed from the committed shards; performance.md's figures from a table it links
    (``[the table above](#...)``, ``table in [page](page.md#...)``) are looked up in that table."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, old, new in [("drafts.md", "| 133,008 |", "| 133,009 |"), ("drafts.md", "9,728 answers", "9,792 answers"),
                           ("drafts.md", "| 24–41 | 64 |", "| 24–40 | 64 |"),
                           ("performance.md", "0.77 and 1.08 ms", "0.77 and 1.18 ms"),
                           ("performance.md", "with 16,384 rows", "with 16,385 rows")]:
        text = (ROOT / "docs" / name).read_text()
        assert old in text
        (docs / name).write_text(text.replace(old, new))
        line = text[:text.index(old)].count("\n") + 1
        found = set(doc_figures.problems(docs / name)) - set(doc_figures.problems(ROOT / "docs" / name))
        assert len(found) == 1 and found.pop().startswith(f"docs/{name}:{line}: "), found
    page = docs / "linked.md"
    table = "<!-- table:x -->\n| config | speedup |\n|---|---|\n| head | 1.23× |\n<!-- /table:x -->"
    page.write_text(f"# A page\n\n## Speed\n\n{table}\n\n## Elsewhere\n\nIn [the table above](#speed), 1.23× AR.\n\n"
                    "In [the section above](#speed), 1.23× AR.\n")
    assert doc_figures.problems(page) == ["docs/linked.md:15: '1.23×' names no source (cite the results file it comes from in its section)"]


class _Parsed(Exception):
    """Raised in place of parsing: the script's parser is built, and nothing else of it runs."""


def parser_of(target: str, module: bool) -> argparse.ArgumentParser | None:
    """The parser a script (``scripts/x.py``) or module (``-m specviz.training.x``) builds when run; None when it parses
    no arguments with argparse."""
    source = (ROOT / target).read_text() if not module else Path(importlib.util.find_spec(target).origin).read_text()
    if "parse_args" not in source:
        return None
    built = {}

    def capture(self, args=None, namespace=None):
        built["parser"] = self
        raise _Parsed

    with unittest.mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
            unittest.mock.patch.object(sys, "argv", [target]), pytest.raises(_Parsed):
        runpy.run_module(target, run_name="__main__") if module else runpy.run_path(str(ROOT / target), run_name="__main__")
    return built["parser"]


def parse_error(command: str) -> str | None:
    """Why ``command`` would not run against this checkout's CLI, scripts, Makefile and tests (None when it parses):
    each part between ``&&`` and before a pipe or redirection, past its variable assignments."""
    for part in re.split(r"\s*&&\s*", command):
        words = shlex.split(re.split(r"\s(?:\||2>&1|>>?)\s?", part)[0])
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words.pop(0)
        if words[:1] == ["make"]:
            if not re.search(rf"^{re.escape(words[1])}:", (ROOT / "Makefile").read_text(), re.M):
                return f"no make target {words[1]}"
            continue
        if words[:1] == ["bash"]:  # a wrapper: its arguments go to the script it hands "$@" to
            handed = re.search(r"(scripts/\w+\.py) \"\$@\"", (ROOT / words[1]).read_text())
            words = [handed[1], *words[2:]] if handed else []
        if words and re.fullmatch(r"(?:\S*/)?python3?|\$PY", words[0]):
            words.pop(0)
        if words[:2] == ["-m", "pytest"] or words[:1] == ["pytest"]:
            missing = [w for w in words if w.startswith("tests/") and not (ROOT / w.split("::")[0]).exists()]
            if missing:
                return f"no test file {missing}"
            continue
        if not words:
            continue
        if words[:2] == ["-m", "specviz"]:
            parser, args = cli.build_parser(), words[2:]
        elif words[:1] == ["-m"]:
            parser, args = parser_of(words[1], module=True), words[2:]
        elif words[:1] and words[0].startswith("scripts/"):
            parser, args = parser_of(words[0], module=False), words[1:]
        else:
            return f"not a command this checkout runs: {part}"
        if parser is None:
            continue
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                parser.parse_args(args)
        except SystemExit:
            return errors.getvalue().strip().splitlines()[-1]
        except cli.UsageError as e:  # the CLI's parser raises this instead of exiting
            return str(e)
    return None


def own_commands(path: str) -> list[str]:
    """The command lines a results file records about itself: ``# command:``, ``Reproduce:`` or ``Command:``, or a
    first line ``# CMD``."""
    text = (ROOT / path).read_text()
    found = re.findall(r"^# command: (.+?)(?:\s{2,}\(.*)?$", text, re.M)
    found += [c for c in re.findall(r"(?:Reproduce|Command): `([^`]+)`", text) if not c.startswith("git ")]
    first = re.match(r"# ((?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?python .+)$", text.splitlines()[0]) if text else None
    return found + ([first[1]] if first else [])


RUN_AS_MAIN = pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
"""runpy's note on running a module of an imported package as __main__, as ``python -m`` does in a fresh process."""

OWN_LINES = [p for p in RESULTS if not p.startswith("results/cuda/") and p.endswith((".md", ".txt", ".log"))]


@RUN_AS_MAIN
@pytest.mark.parametrize("path", OWN_LINES)
def test_a_results_files_own_command_parses(path):
    """A results file's own reproduce line runs as written against the current scripts and CLI (results/cuda/ is
    another engineer's)."""
    assert [(c, e) for c in own_commands(path) if (e := parse_error(c))] == []


@RUN_AS_MAIN
@pytest.mark.parametrize("line", bench_steps.benchmark_steps()[1], ids=lambda line: line[0])
def test_every_elsewhere_command_parses(line):
    glob, command, _ = line
    assert command == "written by hand" or parse_error(command) is None, (glob, command)


def test_the_parse_check_can_fail():
    assert "required" in parse_error(".venv/bin/python scripts/measure_judge_overhead.py")
    assert "unrecognized" in parse_error("python -m specviz bench --no-such-flag")
    assert parse_error("make no-such-target") == "no make target no-such-target"


def test_a_changed_protocol_or_theory_key_fails_the_check_until_the_pages_are_regenerated(monkeypatch, tmp_path):
    pages = [tmp_path / "architecture.md", tmp_path / "app.md"]
    for page in pages:
        page.write_text((ROOT / "docs" / page.name).read_text())
    assert render_reference.main(["--check"], pages=pages) == 0
    monkeypatch.setattr(render_reference.Drafter, "expander", lambda self, tokens, budget=None: None, raising=True)
    assert render_reference.main(["--check"], pages=pages) == 1
    monkeypatch.undo()
    monkeypatch.setitem(render_reference.THEORY_KEYS, "tokens", "tokens the run emitted, edited")
    assert render_reference.main(["--check"], pages=pages) == 1
    monkeypatch.delitem(render_reference.THEORY_KEYS, "tokens")
    with pytest.raises(SystemExit, match="tokens"):
        render_reference.SECTIONS["json-theory"]()
