#!/usr/bin/env bash
# Reproduces the committed results: the acceptance predictor, the standard table and the policy table.
# PER_CATEGORY=0 runs every suite prompt (slow on 2 cores); the committed run used the value in results/*.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PER_CATEGORY=${PER_CATEGORY:-2}
TOKENS=${TOKENS:-64}
export HF_HUB_OFFLINE=1
$PY -m specviz fit-predictor --prompts "${PREDICTOR_PROMPTS:-16}"
$PY -m specviz bench --configs standard --per-category "$PER_CATEGORY" --max-new-tokens "$TOKENS" --out results/bench
$PY -m specviz bench --configs policies --per-category "$PER_CATEGORY" --max-new-tokens "$TOKENS" --out results/policies
