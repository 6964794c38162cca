"""Write the committed verify-cost profile r(k) = T(k)/T(1) that the Explain tab's curves use, from a benchmark CSV
whose rows name their fed rows (the ``trees`` set):

    .venv/bin/python scripts/verify_cost_profile.py --csv results/trees_all_prompts.csv --out assets/verify_cost.json
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from specviz.analysis.cost_model import profile_from_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, required=True, help="a benchmark CSV of the trees set")
    parser.add_argument("--out", type=Path, required=True, help="the profile (JSON) to write")
    args = parser.parse_args()
    rows = list(csv.DictReader(args.csv.open()))
    header = args.csv.with_suffix(".md").read_text().splitlines()
    machine = next((line.removeprefix("Machine: ").split(";")[0] for line in header if line.startswith("Machine: ")), "unknown")
    profile = profile_from_bench(rows, f"{args.csv.as_posix()} ({machine})")
    args.out.write_text(json.dumps({"source": profile.source, "ratios": profile.points}, indent=1) + "\n")
    print(f"{args.out}: r(k) = " + ", ".join(f"{k}: {r:.2f}" for k, r in profile.points.items()))


if __name__ == "__main__":
    main()
