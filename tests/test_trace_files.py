"""Traces as files: a committed version-1 trace loads and every view renders from it with no model; what a later
specviz writes is refused with one line if this one cannot read it; malformed, truncated, oversized and foreign files
fail with one clear line; the HTML page is self-contained."""

import json
from pathlib import Path

import pytest

import specviz
from specviz.api.trace import MAX_TRACE_BYTES, TRACE_VERSION, check_trace
from specviz.bench.harness import GENERATE_KERNELS
from specviz.core.record import upgraded
from specviz.runtime.config import DecodeConfig
from specviz.viz.export import step_views, trace_page

FIXTURE = Path(__file__).parent / "fixtures" / "trace_v1.json"


def test_the_committed_version_1_trace_loads_and_every_view_renders():
    trace = specviz.load_trace(FIXTURE)
    assert trace.steps and trace.baseline is not None and trace.config.temperature == 0.8
    data = trace.to_dict()
    written, fixture, defaults = json.loads(json.dumps(data)), json.loads(FIXTURE.read_text()), DecodeConfig().to_dict()
    for run in (written, written["baseline"]):  # settings added since the fixture was written take their defaults
        added = set(run["config"]) - set(fixture["config"])
        assert all(run["config"].pop(name) == defaults[name] for name in added)
        assert run.pop("version") == TRACE_VERSION  # it is written back as the current version
        assert run.pop("source") is None and run.pop("serving") is None  # version 4's keys: a local run, no export kept
    for run, old in ((written, fixture), (written["baseline"], fixture["baseline"])):
        assert old.pop("version") == 1
        assert run["steps"] == [upgraded(step) for step in old["steps"]]  # converted to this version's keys
        for new, step in zip(run["steps"], old["steps"]):
            assert new["spans"] == {"deciding": 0.0, "drafting": step["draft_ms"], "verifying": step["verify_ms"],
                                    "committing": step["overhead_ms"], "recording": 0.0}
            assert new["why"] == {"policy": step["policy"], "selector": None} and new["drafted"] == len(step["draft_ids"])
        assert {**run["metrics"], **old["metrics"]} == run["metrics"]
        assert set(run["metrics"]) - set(old["metrics"]) == {"spans_ms", "outside_ms"}
        run["steps"], run["metrics"] = old["steps"], old["metrics"]
    assert written == fixture  # otherwise a lossless round trip
    views = step_views(data)
    assert len(views) == len(trace.steps) and all(narration and microscope for narration, microscope in views)
    assert "sv-tok" in trace._repr_html_() and trace.figure().data and trace.speedup
    assert trace.theory is not None and len(trace.to_dataframe()) == len(trace.steps)


def test_a_trace_keeps_transformers_generate_beside_its_baseline_and_an_old_one_loads_without_it(tmp_path):
    old = specviz.load_trace(FIXTURE)
    assert old.transformers is None and "transformers" not in old.to_dict()  # written back as it was read
    assert "speedup vs transformers" not in trace_page(old.to_dict())
    figure = {"tokens_per_s": old.metrics["tokens_per_s"] / 2.5, "wall_s": 2.0, "new_tokens": 40, "same_tokens_as_ar": None,
              "kernels": GENERATE_KERNELS}
    old.transformers = figure
    reloaded = specviz.load_trace(old.save(tmp_path / "with-generate.json"))
    assert reloaded.transformers == figure
    for page in (trace_page(reloaded.to_dict()), reloaded._repr_html_()):  # the same headline as when it was saved
        assert "2.50×" in page and "speedup vs transformers&#x27; generate" in page and "tokens not comparable" in page
    assert [s.name for s in reloaded.figure().data][-1].startswith("transformers' generate")
    failed = {"error": "cannot load model 'x'"}
    old.transformers = failed
    assert "not measured: cannot load model" in trace_page(specviz.load_trace(old.save(tmp_path / "failed.json")).to_dict())


def test_the_page_is_self_contained():
    page = trace_page(specviz.load_trace(FIXTURE).to_dict())
    assert "<script src" not in page and "<link" not in page and "Plotly.newPlot" in page
    assert page.count('<template id="n-') == len(json.loads(FIXTURE.read_text())["steps"])


def write(tmp_path: Path, content) -> Path:
    path = tmp_path / "t.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def damaged(**changes) -> dict:
    data = json.loads(FIXTURE.read_text())
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    return data


@pytest.mark.parametrize("content, fragment", [
    (damaged(version=TRACE_VERSION + 1), f"newer than this specviz reads ({TRACE_VERSION})"),
    (damaged(version="1"), "invalid version"),
    ({"hello": "world"}, "not a specviz trace"),
    ([1, 2, 3], "not a specviz trace"),
    (damaged(steps=None), "'steps' is missing"),
    (damaged(steps=[{"step": 1}]), "step 1 does not have a step's fields"),
    (damaged(spans=[["x"]]), "token span"),
    (damaged(transformers=[1]), "'transformers' is not an object"),
    (damaged(transformers={"tokens_per_s": 0, "wall_s": 1.0, "new_tokens": 0}), "'transformers' has no tokens/s"),
    (FIXTURE.read_bytes()[: len(FIXTURE.read_bytes()) // 2], "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
])
def test_bad_files_fail_with_one_line(tmp_path, content, fragment):
    with pytest.raises(specviz.ConfigError, match="^[^\n]*" + fragment.replace("(", r"\(").replace(")", r"\)")):
        specviz.load_trace(write(tmp_path, content))


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_TRACE_BYTES + 1)
    with pytest.raises(specviz.ConfigError, match="a trace file is at most"):
        specviz.load_trace(path)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(specviz.ConfigError, match="cannot read trace file"):
        specviz.load_trace(tmp_path / "nope.json")


def test_check_trace_accepts_what_save_writes():
    assert check_trace(json.loads(FIXTURE.read_text()))["version"] == 1


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "assets" / "traces").glob("*.json")), ids=lambda p: p.stem)
def test_every_committed_trace_loads_and_every_steps_views_render(path):
    """The example traces were written by older versions (a version 2 trace keeps a single path's tree under `tree`):
    loaded, each step's nodes are node records, and its narration and microscope render with the numbers they show."""
    trace = specviz.load_trace(path)
    data = trace.to_dict()
    assert [len(s.nodes) for s in trace.steps] and all(n.accept_prob is not None for s in trace.steps for n in s.checked)
    views = step_views(data)
    assert len(views) == len(trace.steps) and all(narration and microscope for narration, microscope in views)
