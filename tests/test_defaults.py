"""A first run's defaults are what the committed benchmark measured fastest: the default draft, γ policy and γ are the
fastest chain row of ``results/defaults.csv`` (median over the 48 suite prompts) and beat AR by 1.3× or more there; the
offline preset's best fixed γ and the prompt the page opens on are read from the same file."""

import csv
import statistics
from pathlib import Path

from specviz.analysis.suites import typical_prompt
from specviz.bench.configs import CONFIG_SETS, default_row
from specviz.models.presets import OFFLINE_PRESET, PRESETS
from specviz.ui.handlers import FIRST_PROMPT, example_prompts

RESULTS = Path(__file__).resolve().parent.parent / "results" / "defaults.csv"


def medians() -> tuple[list[dict], dict[str, float]]:
    rows = list(csv.DictReader(RESULTS.open()))
    labels = dict.fromkeys(r["config"] for r in rows)
    return rows, {label: statistics.median(float(r["speedup"]) for r in rows if r["config"] == label) for label in labels}


def test_the_defaults_are_the_fastest_chain_of_the_committed_benchmark_and_beat_ar():
    rows, speed = medians()
    configs = CONFIG_SETS["defaults"](int(rows[0]["new_tokens"]) or 64)
    assert [c.label for c in configs] == list(speed), "results/defaults.csv was made by another version of the set: rerun it"
    mine = default_row(configs)
    assert mine is not None, "DecodeConfig's defaults are none of the candidates the benchmark measures"
    chains = {label: s for label, s in speed.items() if label != "ar" and "tree" not in label}
    assert speed[mine] == max(chains.values()), f"the defaults ({mine}) are not the fastest chain: {chains}"
    assert speed[mine] >= 1.3
    assert len({r["prompt_id"] for r in rows}) == 48


def test_the_best_fixed_gamma_and_the_first_prompt_come_from_the_same_file():
    rows, speed = medians()
    fixed = {label: s for label, s in speed.items() if " fixed γ=" in label}
    assert PRESETS[OFFLINE_PRESET].fixed_gamma == int(max(fixed, key=fixed.get).rsplit("=", 1)[1])
    assert FIRST_PROMPT == typical_prompt(rows, default_row(CONFIG_SETS["defaults"](64)))
    first = next(r for r in rows if r["prompt_id"] == FIRST_PROMPT)
    prompts, labels = example_prompts()
    assert labels[0].startswith(first["category"] + ":") and len(prompts) == 48


def test_the_typical_prompt_is_in_the_category_nearest_the_overall_median():
    rows = [{"prompt_id": f"{c}-{i}", "category": c, "config": "x", "speedup": s}
            for c, speeds in (("a", [1.0, 1.1, 1.2]), ("b", [1.5, 1.6, 1.9]), ("c", [2.0, 2.2, 2.4])) for i, s in enumerate(speeds)]
    assert typical_prompt(rows, "x") == "b-1"  # overall median 1.6; b's median 1.6, its prompt nearest it
