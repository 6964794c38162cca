#!/usr/bin/env bash
# Reproduces the committed results, one step per result; each step writes only its own files, with the settings
# the committed file was made with (its header states them). The standard, all-prompts, policies, selection and
# judge-head-draft files were made before the EAGLE-3-style head was bundled and measured head-v1 under the name "head":
# those steps write _eagle3-suffixed files beside them (policies_eagle3 and selection_eagle3 are committed). The other
# steps use no head, or (heads) name both heads, and rewrite their committed files. record-overhead (which writes
# results/record_overhead_wall.md), ui (which measures the draft "head" and overwrites its file) and advisor run only
# when asked (STEPS=...).
# Run on a quiet machine: other CPU load distorts every timing. STEPS selects parts, e.g. STEPS="chains judge".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PER_CATEGORY=${PER_CATEGORY:-2}
TOKENS=${TOKENS:-64}
STEPS=${STEPS:-"predictor standard all-prompts heads policies selection chains judge judge-confidence judge-head-draft judge-overhead"}
V2=_eagle3
export HF_HUB_OFFLINE=1
for step in $STEPS; do
  case $step in
    predictor) $PY -m specviz fit-predictor --prompts "${PREDICTOR_PROMPTS:-0}" ;;
    standard) $PY -m specviz bench --configs standard --per-category "$PER_CATEGORY" --max-new-tokens "$TOKENS" --repeats "${REPEATS:-2}" --out results/bench"$V2" ;;
    all-prompts) $PY -m specviz bench --configs standard --only "ar,sd head γ=2,sd head γ=3,sd draft-m γ=3,hf-assisted draft-m γ=3" \
      --per-category 0 --max-new-tokens 64 --repeats 2 --out results/bench_all_prompts"$V2" ;;
    heads) $PY -m specviz bench --configs heads --per-category 0 --max-new-tokens 64 --repeats 2 --out results/heads ;;
    policies) $PY -m specviz bench --configs policies --per-category "$PER_CATEGORY" --max-new-tokens "$TOKENS" --repeats "${REPEATS:-2}" --out results/policies"$V2" ;;
    selection) $PY -m specviz bench --configs selection --per-category "$PER_CATEGORY" --max-new-tokens "$TOKENS" --repeats "${REPEATS:-2}" --out results/selection"$V2" ;;
    chains) $PY -m specviz bench --configs chains --per-category "$PER_CATEGORY" --max-new-tokens "$TOKENS" --out results/chains ;;
    judge) $PY -m specviz bench --configs judge --suite judge-eval --max-new-tokens "${JUDGE_TOKENS:-48}" --out results/judge ;;
    judge-confidence) $PY -m specviz bench --configs judge --suite judge-eval --max-new-tokens "${JUDGE_TOKENS:-48}" \
      --only "exact,judge δ=0.7,judge δ=0.5" --out results/judge_confidence ;;
    judge-head-draft) $PY -m specviz bench --configs judge-head --suite judge-eval --max-new-tokens "${JUDGE_TOKENS:-48}" \
      --only "exact,judge δ=0.7,judge δ=0.5" --out results/judge_head_draft"$V2" ;;
    judge-overhead) $PY scripts/measure_judge_overhead.py ;;
    record-overhead) $PY scripts/measure_record_overhead.py ;;
    ui) $PY scripts/measure_ui.py 6 | tee results/ui_measure.txt ;;
    advisor) $PY -m specviz chain-advisor --prompts 3 --max-new-tokens 48 --top 3 | tee results/chain_advisor.txt ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
