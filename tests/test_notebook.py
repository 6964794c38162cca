"""The quickstart notebook runs top to bottom in a real Jupyter kernel (this interpreter's), and the Python API works
in a notebook without Gradio: the trace cell displays the token view inline and nothing imports gradio."""

import json
import os
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
INLINE_TRACE_TAG = "inline-trace"  # the tag of the cell whose last expression is the trace

PROBE = "import json, sys\nprint('SPECVIZ-KERNEL ' + json.dumps({'executable': sys.executable, 'prefix': sys.prefix}))"


class _TokenSpans(HTMLParser):
    """Counts the token spans (``<span class="sv-tok ...">``) of the token view, leaving out the legend's samples."""

    def __init__(self):
        super().__init__()
        self.divs: list[list[str]] = []
        self.tokens = 0

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "div":
            self.divs.append(classes)
        elif tag == "span" and "sv-tok" in classes:
            inside = [c for div in self.divs for c in div]
            if "sv-tokens" in inside and "sv-legend" not in inside:
                self.tokens += 1

    def handle_endtag(self, tag):
        if tag == "div" and self.divs:
            self.divs.pop()


def token_spans(html: str) -> int:
    parser = _TokenSpans()
    parser.feed(html)
    return parser.tokens


def cell_errors(nb) -> list[str]:
    """Every error output, and every stderr stream carrying a traceback, as 'cell N: ...'."""
    problems = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
            elif out.get("output_type") == "stream" and out.get("name") == "stderr" and "Traceback" in out.get("text", ""):
                problems.append(f"cell {i}: traceback on stderr: {out['text'][-500:]}")
    return problems


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec named python3 that runs this interpreter, ahead of any other on the Jupyter path."""
    from ipykernel.kernelspec import install

    install(kernel_name="python3", prefix=str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.delenv("PYTHONPATH", raising=False)

    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] == sys.executable, spec.argv


@pytest.mark.slow
def test_quickstart_notebook_runs_in_a_kernel(kernel_env):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    tagged = [i for i, c in enumerate(nb.cells) if INLINE_TRACE_TAG in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"exactly one cell should be tagged {INLINE_TRACE_TAG!r}"

    nb.cells.append(nbformat.v4.new_code_cell(PROBE))  # which interpreter the kernel runs (not part of the notebook)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()

    assert cell_errors(nb) == []
    probe = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    assert probe.startswith("SPECVIZ-KERNEL "), probe
    kernel = json.loads(probe.removeprefix("SPECVIZ-KERNEL "))
    assert kernel == {"executable": sys.executable, "prefix": sys.prefix}

    results = [o for o in nb.cells[tagged[0]].outputs if o.get("output_type") == "execute_result"]
    assert results, "the trace cell shows no result: its last expression should be the trace"
    html = results[0]["data"].get("text/html", "")
    assert "sv-tok" in html and "specviz-trace" in html, "the trace is not displayed inline as HTML"
    assert token_spans(html) >= 10, "the inline token view holds no tokens"


@pytest.mark.slow
def test_api_does_not_import_gradio(tmp_path):
    script = textwrap.dedent("""
        import json, sys
        import specviz
        trace = specviz.speculate("Say hi.", max_new_tokens=8)
        html = trace._repr_html_()
        trace.figure()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("gradio", "gradio_client"))
        print(json.dumps({"gradio": "gradio" in sys.modules, "loaded": loaded, "html": html, "tokens": len(trace.token_ids)}))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 0
    assert token_spans(result["html"]) > 0
    assert result["gradio"] is False and result["loaded"] == [], f"the API imported gradio: {result['loaded'][:5]}"
