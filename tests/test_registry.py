"""A new γ policy is one class in one file: dropped into specviz/methods/, it appears in the settings' choices,
the CLI, the app's dropdown and the benchmark's policies set, with no other edit."""

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

    def observe(self, event) -> None:
        full = event.accepted == len(event.draft_ids)
        self.gamma = min(10, self.gamma * 2) if full else max(1, self.gamma // 2)
'''
CHECK = '''
from specviz.bench.harness import policy_configs
from specviz.core.registry import GAMMA_POLICIES
from specviz.runtime.config import DecodeConfig
from specviz.ui.controls import registry_dropdown

assert "doubling-probe" in DecodeConfig.settings()["gamma_policy"].options()
DecodeConfig(gamma_policy="doubling-probe").validate()
assert "doubling-probe" in [label for label, _ in registry_dropdown("gamma_policy", GAMMA_POLICIES).choices]
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
