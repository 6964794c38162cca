"""A new γ policy is one class in one file: dropped into specviz/methods/, it appears in the settings' choices,
the CLI, the app's dropdown and the benchmark's policies set, with no other edit. A new setting is one field of
DecodeConfig: the CLI, the app's forms and Compare's table grow a control for it, and baselines leave it out."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICY = '''
from specviz.core.policy import LengthPolicy
from specviz.core.registry import GAMMA_POLICIES


@GAMMA_POLICIES.register("Double γ after a full accept, halve it after a rejection.", ("gamma",))
class DoublingPolicy(LengthPolicy):
    name = "doubling-probe"

    def observe(self, outcome) -> None:
        full = outcome.accepted == outcome.drafted
        self.gamma = min(10, self.gamma * 2) if full else max(1, self.gamma // 2)
'''
CHECK = '''
from specviz.bench.configs import policy_configs
from specviz.core.registry import GAMMA_POLICIES
from specviz.runtime.config import DecodeConfig
from specviz.ui.controls import describe, setting_control

assert "doubling-probe" in DecodeConfig.settings()["gamma_policy"].options()
DecodeConfig(gamma_policy="doubling-probe").validate()
assert "doubling-probe" in [label for label, _ in setting_control("gamma_policy", "probe").choices]
assert describe("gamma_policy", "doubling-probe") == "doubling-probe: " + GAMMA_POLICIES.entry("doubling-probe").description
assert "doubling-probe" in [c.label for c in policy_configs(16)]
print("ok")
'''


def test_a_new_policy_file_reaches_the_config_cli_ui_and_bench():
    probe = ROOT / "specviz" / "methods" / "_doubling_probe.py"
    probe.write_text(POLICY)
    try:
        env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PATH": "/usr/bin:/bin"}
        check = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert check.returncode == 0 and "ok" in check.stdout, check.stderr[-2000:]
        cli = subprocess.run([sys.executable, "-m", "specviz", "generate", "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        assert "doubling-probe" in cli.stdout
    finally:
        probe.unlink()


NEW_SETTING = '''
from __future__ import annotations  # as in config.py: the fields' types are read as text

import dataclasses

from specviz.runtime import config


@dataclasses.dataclass
class WithProbe(config.DecodeConfig):
    probe_nodes: int = config.setting(1, "nodes of a hypothetical draft shape", label="probe nodes", low=1, high=64)
    probe_shape: str = config.setting("chain", "a draft shape", label="probe shape", choices=("chain", "wide", "deep", "flat"))


config.DecodeConfig = WithProbe  # what editing the class itself does, before anything reads its fields

import gradio as gr

from specviz.cli import build_parser
from specviz.runtime.prepare import baseline_config
from specviz.ui.app import build_app
from specviz.ui.comparison import CONFIG_COLUMNS, parse_table
from specviz.ui.controls import SettingsForm
from specviz.ui.state import form_config

with gr.Blocks():
    form = SettingsForm("probe")
    form.add(WithProbe.settings())
nodes, kind = form.controls["probe_nodes"], form.controls["probe_shape"]
assert isinstance(nodes, gr.Slider) and (nodes.label, nodes.minimum, nodes.maximum, nodes.value) == ("probe nodes", 1, 64, 1), nodes
assert nodes.info == "nodes of a hypothetical draft shape" and nodes.elem_id == "probe-probe-nodes"
assert isinstance(kind, gr.Dropdown) and [v for _, v in kind.choices] == ["chain", "wide", "deep", "flat"]
probe = form_config({"probe_nodes": 8, "probe_shape": "wide"})
assert isinstance(probe, WithProbe) and probe.probe_nodes == 8 and baseline_config(probe).probe_nodes == 1
try:
    form_config({"probe_nodes": 65})
    raise AssertionError("the new setting's range is not checked")
except config.ConfigError as exc:
    assert "--probe-nodes must be between 1 and 64" in str(exc), exc
api = build_app().get_api_info()["named_endpoints"]["/explore_run"]["parameters"]
assert {"probe_nodes", "probe_shape"} <= {p["parameter_name"] for p in api}
assert "probe nodes" in CONFIG_COLUMNS
assert dict(parse_table([{"label": "a", "probe nodes": 4}], {}))["a"].probe_nodes == 4
assert build_parser().parse_args(["generate", "--prompt", "x", "--probe-nodes", "3"]).probe_nodes == 3
print("ok")
'''


def test_a_new_setting_is_one_field_and_reaches_the_cli_ui_and_compare():
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PATH": "/usr/bin:/bin"}
    check = subprocess.run([sys.executable, "-c", NEW_SETTING], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "ok" in check.stdout, check.stderr[-3000:]
