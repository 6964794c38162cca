"""Every figure in the docs checked at its source. A figure is a decimal, a number with thousands separators, or a
number with a unit (×, %, tok/s, ms, "N of M", "N/M", M or k) in the prose and hand-made tables of README.md, docs/*.md and the
notebook's markdown (generated blocks, code and settings such as ``γ = 3`` are left out). Each must be

- a restated constant of the code: CONSTANTS below names the sentence and the value it must show; or
- a line of a fenced block that quotes a results file its section cites (shown as the file has it); or
- a figure computed from committed files that no results file states (the distillation shards' counts): CONSTANTS
  names the sentence, and computes the value from the files; or
- held by a file its paragraph (or list item) cites, or when it cites none its section (``results/...``, an ``assets/...json`` or
  ``.jsonl``), or by a table rendered from the results in its section or in a section its paragraph links as a table
  (``[the table above](#section)``, ``table in [page](page.md#section)``): some number there rounds to the figure at
  its precision (a percentage also as a fraction; a trace's speedup is its ``tokens_per_s`` over its baseline's).

    python scripts/doc_figures.py          # print every figure that fails, with its page and line; exit 1 if any
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.ipynb"))]
GENERATED = re.compile(r"<!-- (table|ref):([\w-]+) -->\n.*?<!-- /\1:\2 -->", re.S)
SKIPPED = re.compile(r"<!-- zerogpu:begin -->.*?<!-- zerogpu:end -->", re.S)
"""Left to the section's owner (its numbers come from results/cuda/)."""
NOT_FIGURES = re.compile(r"```.*?```|`[^`\n]*`|\]\([^)]*\)|\d{4}-\d\d-\d\d|"
                         r"(?:Lemma|Theorems?|Llama|PyTorch|python_version:|sdk_version:)\s*\"?[\d.]+(?:\s*[–/-]\s*[\d.]+)?", re.S)
FIGURE = re.compile(r"(?<![\w.,=/^+−-])(?<!= )(?<!γ )(?<!δ )"
                    r"(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+(?=\s?(?:×|%|tok/s|ms\b| of \d|/\d|[Mk]\b)))(?![\w.,]*\d)(?![A-Za-z])"
                    r"(?:\s?(?:×|%|tok/s|ms\b| of \d+|/\d+|(?P<scale>[Mk])\b))?")
SCALES = {"M": 1e6, "k": 1e3}
"""A figure given in millions or thousands ("3.21 M positions", "934k tokens")."""
CITED = re.compile(r"results/[\w./{},*-]*[\w}*]|assets/[\w./-]*\.jsonl?\b")
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?![\d])|-?\d+(?:\.\d+)?(?:e-?\d+)?")


@dataclass(frozen=True)
class Constant:
    """A sentence that restates a constant of the code: each group of ``pattern`` must read ``values()`` (with
    ``of_match``, ``values(match)``: what that sentence's own groups must read), in order."""

    page: str
    pattern: str
    values: Callable[..., tuple[float | str, ...]]
    of_match: bool = False


def _default(fn: Callable, name: str) -> float:
    return inspect.signature(fn).parameters[name].default


def _policies():
    from specviz.methods import policies
    return policies


def _threads():
    from specviz.models.backends import threads
    return threads


def _ui(module: str):
    import importlib
    return importlib.import_module(f"specviz.ui.{module}")


def _speeds() -> tuple[float, ...]:
    from specviz.viz.export import SPEEDS
    return SPEEDS


def _duration_example() -> tuple[float, ...]:
    """spaces.md's worked example: Explore's first call's duration, before any measurement."""
    from specviz.ui import gpu
    tokens = _ui("explore").TOKENS
    return tokens, gpu.START_S_PER_TOKEN, gpu.FIXED_S, gpu.MARGIN, gpu.START_S_PER_TOKEN, tokens, gpu.decode_seconds(tokens)


WORDS = ("no", "one", "two", "three", "four")
"""Small counts as the docs write them."""


def _selection():
    from specviz.methods import selection
    return selection


def _warmup() -> list:
    from specviz.analysis.suites import load_warmup
    return load_warmup(0)


def _distill():
    from specviz.training import distill_data
    return distill_data


def _vocab(model: str) -> float:
    return json.loads((ROOT / "assets" / "models" / model / "draft_vocab.json").read_text())["size"]


@cache
def _shards() -> tuple[tuple[int, int], ...]:
    """(answers, answer tokens) of each committed distillation shard (``assets/distill/data/shard-*.npz``), in order."""
    import numpy as np
    answers = [np.load(path, allow_pickle=True)["answer"] for path in sorted((ROOT / "assets/distill/data").glob("shard-*.npz"))]
    return tuple((len(a), sum(len(answer) for answer in a)) for a in answers)


def _shard_range(m: re.Match) -> tuple[float | str, ...]:
    """A row of drafts.md's shard table: its first and last shard (present), the answers each holds, their tokens."""
    first, last = int(m[1]), int(m[2])
    rows = _shards()[first:last + 1]
    per_shard = {answers for answers, _ in rows}
    return (first, first + len(rows) - 1, per_shard.pop() if len(per_shard) == 1 else "not one count",
            sum(tokens for _, tokens in rows))


def _cli_default(path: str, dest: str) -> float:
    import render_reference
    return render_reference.subcommand(path).get_default(dest)


def _makefile(pattern: str) -> str:
    return re.search(pattern, (ROOT / "Makefile").read_text())[1]


def _pin(package: str) -> str:
    return re.search(rf"^{package}==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)[1]


CONSTANTS = [
    Constant("docs/methods.md", r"last h = (\d+) steps", lambda: (_default(_policies().OnlinePolicy, "h"),)),
    Constant("docs/methods.md", r"capped at (0\.\d+)", lambda: (_default(_policies().OnlinePolicy, "acc_max"),)),
    Constant("docs/methods.md", r"pseudo-observation at (0\.\d+)", lambda: (_default(_policies().OnlinePolicy, "prior"),)),
    Constant("docs/methods.md", r"draft probability falls below (0\.\d+)", lambda: (_default(_policies().ConfidencePolicy, "threshold"),)),
    Constant("docs/methods.md", r"three depths \(layers (\d+), (\d+) and (\d+)",
             lambda: tuple(json.loads((ROOT / "assets/models/smollm2-head/specviz.json").read_text())["taps"])),
    Constant("docs/methods.md", r"shrunk towards a\s+prior by (\w+) pseudo-observations",
             lambda: (WORDS[int(_default(_selection().OnlineSelector, "prior_weight"))],)),
    Constant("docs/methods.md", r"on the (\d+) warm-up prompts", lambda: (len(_warmup()),)),
    Constant("docs/performance.md", r"After the prefill and (\w+) forwards, at least (\w+) forwards run",
             lambda: (WORDS[_threads().FIRST_WAIT[1]], WORDS[_threads().PROBE_FORWARDS[0]])),
    Constant("docs/performance.md", r"would take at most ([\d.]+) of the running count's time",
             lambda: (_threads().SWITCH,)),
    Constant("docs/performance.md", r"after (\d+) s and (\d+) forwards after a clear one", lambda: _threads().LONGEST_WAIT),
    Constant("docs/app.md", r"headline redraw every ([\d.]+) s and the\s+race chart and step panel every ([\d.]+) s",
             lambda: (_ui("runs").REDRAW_EVERY_S, _ui("runs").CHARTS_EVERY_S)),
    Constant("docs/app.md", r"polls for work every (\d+) ms instead of every (\d+) ms",
             lambda: (1e3 * _ui("app").QUEUE_POLL_S[0], 1e3 * _ui("app").GRADIO_POLL_S[0])),
    Constant("docs/app.md", r"a run waits ([\d.]+) s after clearing the page", lambda: (_ui("explore").PAGE_SETTLE_S,)),
    *(Constant(page, r"AR at ([\d.]+)×–([\d.]+)×|sped up \(([\d.]+)×–([\d.]+)×\)", lambda: (min(_speeds()), max(_speeds())))
      for page in ("README.md", "docs/app.md", "docs/teaching.md")),
    Constant("docs/spaces.md", r"duration = int\(min\((\d+), (\d+) \+ ([\d.]+) ×",
             lambda: (_ui("gpu").MAX_S, _ui("gpu").FIXED_S, _ui("gpu").MARGIN)),
    Constant("docs/spaces.md", r"an exponential average, ([\d.]+) ×\s+the old value \+ ([\d.]+) × the newest; ([\d.]+) s",
             lambda: (_ui("gpu").DECAY, 1 - _ui("gpu").DECAY, _ui("gpu").START_S_PER_TOKEN)),
    Constant("docs/spaces.md", r"Explore decodes (\d+) new tokens by default.*?starting ([\d.]+) s per token each asks for "
             r"`int\((\d+) \+ ([\d.]+) × ([\d.]+) × (\d+)\)` = (\d+) s",
             _duration_example),
    Constant("docs/spaces.md", r"(\d+) s covers loading and prefill, and the factor ([\d.]+) is a margin",
             lambda: (_ui("gpu").FIXED_S, _ui("gpu").MARGIN)),
    Constant("docs/judge.md", r"l2 ([\d.]+), junk weight ([\d.]+): the defaults",
             lambda: (_cli_default("judge train", "l2"), _cli_default("judge train", "junk_weight"))),
    *(Constant(page, pattern, lambda: (_vocab("smollm2-draft-s"), _vocab("smollm2-head")))
      for page, pattern in (("docs/models.md", r"drafts list ([\d,]+) ids, the feature head ([\d,]+)"),
                            ("docs/drafts.md", r"the ([\d,]+) token ids it scores.*?`draft_vocab.json`\s+\(([\d,]+) ids\)"),
                            ("docs/benchmarks.md", r"score their ([\d,]+)-token vocabulary.*?feature heads score ([\d,]+)"))),
    Constant("docs/drafts.md", r"sampled at temperature ([\d.]+) from the recipe", lambda: (_distill().SAMPLED[0],)),
    Constant("docs/drafts.md", r"scale per row: ([\d.]+) MB",
             lambda: (round((ROOT / "assets/models/smollm2-head/head.safetensors").stat().st_size / 1e6, 1),)),
    Constant("docs/drafts.md", r"The committed data is (\d+) shards, ([\d,]+) answers,\s+([\d,]+) answer tokens",
             lambda: (len(_shards()), sum(a for a, _ in _shards()), sum(t for _, t in _shards()))),
    Constant("docs/drafts.md", r"^\| (\d+)–(\d+) \| (\d+) \| ([\d,]+) \|", _shard_range, of_match=True),
    Constant("docs/performance.md", r"(?<=ms )with ([\d,]+) rows against",
             lambda: tuple(sorted({_vocab("smollm2-draft-s"), _vocab("smollm2-draft-m")}))),
    Constant("docs/models.md", r"the ([\d,]+)-row output projection",
             lambda: (json.loads((ROOT / "assets/models/smollm2-draft-s/config.json").read_text())["vocab_size"],)),
    Constant("README.md", r"^sdk_version: (\S+)", lambda: (_pin("gradio"),)),
    Constant("README.md", r"`make` needs `python(3\.\d+)`", lambda: (_makefile(r"PY \?= python(\S+)"),)),
    Constant("README.md", r"with `torch==(\S+)` where pip finds", lambda: (_makefile(r"torch==(\S+)"),)),
]


def same(text: str, value: object) -> bool:
    try:
        return math.isclose(float(text.replace(",", "")), float(value))
    except (TypeError, ValueError):
        return text == str(value)


def constant_problems(page: str, text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The constants of ``page`` that differ from the code (or whose sentence is gone), and the spans they cover."""
    problems, spans = [], []
    for c in (c for c in CONSTANTS if c.page == page):
        found = list(re.finditer(c.pattern, text, re.M | re.S))
        if not found:
            problems.append(f"{page}: no sentence matches the constant pattern {c.pattern!r} (update CONSTANTS)")
        for m in found:
            groups = [i for i in range(1, len(m.groups()) + 1) if m[i] is not None]
            expected = c.values(m) if c.of_match else c.values()
            wrong = [i for i, value in zip(groups, expected) if not same(m[i], value)] or groups[len(expected):]
            if wrong or len(groups) != len(expected):
                at = m.start(wrong[0]) if wrong else m.start()
                problems.append(f"{page}:{line_of(text, at)}: {m[0]!r} restates {expected} of the code")
            spans.append(m.span())
    return problems, spans


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def expand(ref: str) -> list[str]:
    """``results/a.{csv,md}`` as ``results/a.csv`` and ``results/a.md``."""
    m = re.search(r"\{([^}]*)\}", ref)
    return [ref] if not m else [p for alt in m[1].split(",") for p in expand(ref[:m.start()] + alt + ref[m.end():])]


@cache
def committed(top: str) -> tuple[str, ...]:
    return tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / top).rglob("*") if p.is_file()))


def cited(text: str) -> list[str]:
    """The committed files a text cites: results paths (a stem, a brace list or a glob) and JSON files under assets/."""
    found = []
    for ref in CITED.findall(text):
        for path in expand(ref):
            found += [f for f in committed(path.split("/")[0]) if f == path or f.startswith(path + ".")
                      or fnmatch.fnmatch(f, path) or f.startswith(path.rstrip("/") + "/")]
    return sorted(set(found))


@cache
def numbers(path: str) -> tuple[float, ...]:
    """What a source holds: every number of its text; of a trace, its metrics, its baseline's and its speedup; of a
    JSON-lines file, its rows and how many rows hold each value of a field with few values."""
    text = (ROOT / path).read_text()
    if path.endswith(".jsonl"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        fields = {k: Counter(str(r.get(k)) for r in rows) for k in rows[0]}
        return (len(rows), *(n for counts in fields.values() if len(counts) <= 12 for n in counts.values()))
    if path.startswith("assets/traces/"):
        trace = json.loads(text)
        runs = [trace["metrics"], trace.get("baseline", {}).get("metrics", {})]
        values = [v for m in runs for v in m.values() if isinstance(v, int | float)]
        return (*values, *([runs[0]["tokens_per_s"] / runs[1]["tokens_per_s"]] if runs[1] else []))
    return tuple(float(n.replace(",", "")) for n in NUMBER.findall(text))


def holds(figure: str, values: list[float], scale: float = 1.0) -> bool:
    """Whether one of ``values`` (or 100 × one: a percentage) shows as ``figure`` at its precision (either way of
    rounding a half), ``scale`` being what the figure's unit multiplies it by."""
    digits = figure.replace(",", "")
    half = 0.5 * 10 ** -(len(digits.split(".")[1]) if "." in digits else 0) + 1e-9
    want = float(digits)
    return any(abs(abs(x) / scale - want) <= half for v in values for x in (v, 100 * v))  # "4.5 points" of a −4.5


def page_text(page: Path) -> str:
    """A page's checked text: markdown as is, a notebook's markdown cells (one per block), the skipped section blanked
    (its lines kept, so that line numbers hold)."""
    if page.suffix == ".ipynb":
        cells = json.loads(page.read_text())["cells"]
        text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = page.read_text()
    return SKIPPED.sub(lambda m: "\n" * m[0].count("\n"), text)


def blank(text: str, pattern: re.Pattern | str) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (newlines kept): positions still name lines."""
    return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m[0]), text)


QUOTED = re.compile(r"^```\n(.*?)^```", re.M | re.S)
"""A fenced block without a language: where a page quotes a results file's output."""


def quote_problems(name: str, text: str) -> list[str]:
    """A quoted block that shares a line with a file its section cites must show only that file's lines."""
    found, offset = [], 0
    for section in re.split(r"\n(?=#+ )", text):
        files = [(ROOT / p).read_text() for p in cited(section) if not p.endswith((".csv", ".json", ".jsonl"))]
        for block in QUOTED.finditer(section):
            lines = [(block.start(1) + m.start(), m[0].strip()) for m in re.finditer(r"[^\n]*\S[^\n]*", block[1])]
            source = next((f for f in files if any(line in f for _, line in lines)), None)
            if source is not None:
                found += [f"{name}:{line_of(text, offset + at)}: quoted line {line!r} is not in the file it quotes"
                          for at, line in lines if line not in source]
        offset += len(section) + 1
    return found


def table_numbers(section: str) -> list[float]:
    """The numbers of the rendered tables of a section."""
    return [float(n.replace(",", "")) for block in GENERATED.finditer(section) for n in NUMBER.findall(block[0])]


LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<page>[\w./-]*)#(?P<anchor>[^)\s]+)\)")


def slug(header: str) -> str:
    """A header's anchor as GitHub makes it: lower case, punctuation but ``-`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", header.strip().lstrip("#").strip().lower()).replace(" ", "-")


def linked_tables(name: str, text: str, block: str) -> list[float]:
    """The numbers of the rendered tables of the sections ``block`` links as a table (``[the table above](#s)``,
    ``table in [page](page.md#s)``); ``text`` is the page ``name`` itself, for a link within it."""
    found = []
    for m in LINK.finditer(block):
        if not re.search(r"\btables?\b", m["text"]) and not re.search(r"\btables? in\s+$", block[:m.start()]):
            continue
        target = text if not m["page"] else (ROOT / Path(name).parent / m["page"]).read_text()
        found += [n for section in re.split(r"\n(?=#+ )", target) if slug(section.split("\n")[0]) == m["anchor"]
                  for n in table_numbers(section)]
    return found


BLOCK = re.compile(r"(?:[^\n]*\S[^\n]*(?:\n|$))(?:(?![-*] |\d+\. )[^\n]*\S[^\n]*(?:\n|$))*")
"""A paragraph, a list item (with its continuation lines and nested items) or a table: what a citation covers."""


def problems(page: Path) -> list[str]:
    """Every figure of ``page`` that fails, as ``PAGE:LINE: ...``."""
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else "/".join(  # a copy: named as its original
        [page.parent.name, page.name] if page.parent.name in ("docs", "examples") else [page.name])
    text = page_text(page)
    found, spans = constant_problems(name, text)
    found += quote_problems(name, text)
    prose = blank(blank(text, GENERATED), NOT_FIGURES)
    for start, end in spans:
        prose = prose[:start] + re.sub(r"[^\n]", " ", prose[start:end]) + prose[end:]
    offset = 0
    for section in re.split(r"\n(?=#+ )", text):
        tables = table_numbers(section)
        for block in BLOCK.finditer(section):
            sources = cited(GENERATED.sub("", block[0])) or cited(section)
            linked = linked_tables(name, text, block[0])
            values = [v for path in sources for v in numbers(path)] + tables + linked
            for m in FIGURE.finditer(prose, offset + block.start(), offset + block.end()):
                where = f"{name}:{line_of(text, m.start())}: {m[0].strip()!r}"
                if not sources and not linked:
                    found.append(f"{where} names no source (cite the results file it comes from in its section)")
                elif not holds(m[1], values, SCALES.get(m["scale"], 1.0)):
                    found.append(f"{where} is not in {', '.join(sources) or 'a cited file'} (its paragraph's sources, else its section's) "
                                 "nor in the rendered tables of its section or of one it links as a table")
        offset += len(section) + 1
    return found


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    bad = [p for page in PAGES for p in problems(page)]
    print("\n".join(bad) or "every figure is held by its source", file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
