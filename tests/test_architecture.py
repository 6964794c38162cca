"""The import contract: the folder tree is the architecture.

Layers, lowest first; a module may import its own layer and lower ones, never a higher one or a sibling at its
level: core → models → methods → runtime → analysis → bench | training → viz → api → ui | cli. gradio is
imported only under ``specviz/ui``, and no import cycle exists among specviz's modules, imports inside
functions included."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specviz"
LAYERS = [("core",), ("models",), ("methods",), ("runtime",), ("analysis",), ("bench", "training"), ("viz",), ("api",), ("ui", "cli")]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of a file, at any depth, relative ones resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names if f"{base}.{alias.name}" in MODULES]
    return found


def layer(module: str) -> str:
    """A module's layer: its subpackage, or for a top-level module its name (``specviz`` itself is the API's facade)."""
    parts = module.split(".")
    return {"__main__": "cli"}.get(parts[1], parts[1]) if len(parts) > 1 else "api"


def violations() -> list[str]:
    out = []
    for name, path in MODULES.items():
        for target, line in imports(path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
            if target.split(".")[0] == "gradio" and layer(name) != "ui":
                out.append(f"{where}: gradio belongs to specviz/ui only")
            if target in MODULES and layer(target) != layer(name) and RANK[layer(target)] >= RANK[layer(name)]:
                out.append(f"{where}: layer '{layer(name)}' may not import layer '{layer(target)}'")
    return out


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), plus modules importing themselves."""
    graph = {name: sorted({t for t, _ in imports(path) if t in MODULES and t != name}) for name, path in MODULES.items()}
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_module_sits_in_a_known_layer():
    assert {layer(m) for m in MODULES} <= set(RANK)


def test_no_layer_imports_a_higher_one_and_gradio_stays_in_the_ui():
    assert violations() == []


def test_no_import_cycles_function_level_imports_included():
    assert cycles() == []


@pytest.mark.parametrize("source, expected", [
    ("from specviz.ui.app import build_app\n", "layer 'core' may not import layer 'ui'"),
    ("def f():\n    import gradio\n", "gradio belongs to specviz/ui only"),
])
def test_the_contract_catches_a_bad_import(tmp_path, monkeypatch, source, expected):
    bad = PACKAGE / "core" / "_contract_probe.py"
    monkeypatch.setitem(MODULES, "specviz.core._contract_probe", bad)
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == bad else Path.__dict__["read_bytes"](self).decode())
    assert any(expected in v for v in violations())


def test_the_contract_catches_a_cycle(monkeypatch):
    a, b = PACKAGE / "core" / "_probe_a.py", PACKAGE / "core" / "_probe_b.py"
    texts = {a: "def f():\n    from specviz.core import _probe_b\n", b: "from specviz.core import _probe_a\n"}
    monkeypatch.setitem(MODULES, "specviz.core._probe_a", a)
    monkeypatch.setitem(MODULES, "specviz.core._probe_b", b)
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: texts.get(self) or Path.__dict__["read_bytes"](self).decode())
    assert ["specviz.core._probe_a", "specviz.core._probe_b"] in cycles()


UI_MODELS = ("specviz.ui.runs", "specviz.ui.comparison", "specviz.ui.state")
"""The app's model of a run and of a comparison: state, metrics and exports, beside the layout code."""


def reaches_gradio(module: str, seen: set[str] | None = None) -> list[str]:
    """The chain of specviz imports from ``module`` to gradio, if any (package ``__init__`` files left out)."""
    seen = set() if seen is None else seen
    seen.add(module)
    for target, _ in imports(MODULES[module]):
        if target.split(".")[0] == "gradio":
            return [module, target]
        if target in MODULES and target not in seen and not MODULES[target].name == "__init__.py":
            chain = reaches_gradio(target, seen)
            if chain:
                return [module, *chain]
    return []


@pytest.mark.parametrize("module", UI_MODELS)
def test_the_uis_model_of_runs_and_comparisons_does_not_need_gradio(module):
    assert reaches_gradio(module) == []


def test_explore_and_compare_share_the_runs_module_instead_of_each_other():
    for tab, other in (("explore", "compare"), ("compare", "explore")):
        targets = {t for t, _ in imports(MODULES[f"specviz.ui.{tab}"])}
        assert "specviz.ui.runs" in targets and f"specviz.ui.{other}" not in targets


RECORDS = ("NodeRecord", "LevelRecord", "TreeRecord", "Scores")


def test_display_records_are_built_by_the_recorder_only():
    """Verification and drafting hand over evidence; only the recorder turns it into records (and the records' own module
    reads them back from JSON)."""
    built = [f"{name}: {ast.unparse(n.func)}" for name, path in MODULES.items()
             if name not in ("specviz.core.record", "specviz.core.recorder")
             for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call) and ast.unparse(n.func) in RECORDS]
    assert built == []


def test_loading_types_live_in_models():
    assert "class LoadedModel" not in (PACKAGE / "core" / "cache.py").read_text()
    assert "class LoadedModel" in (PACKAGE / "models" / "loaded.py").read_text()
