#!/usr/bin/env bash
# Rebuilds the bundled drafts the way the committed ones were made: round 1 of target answers (resumable,
# shards under assets/distill/data), both drafts trained side by side on one torch thread each, the feature
# head on both threads; then round 2 of answers (the full recipe, another seed) and the head trained on from
# round 1's head over both rounds; then round 3 (bf16 answers to instructions not yet answered) and the head
# trained on again over all three (bundled as head-v1); then round 4 and the EAGLE-3-style head, trained in two runs.
# MINUTES caps each draft fit; the committed drafts used the values recorded in assets/models/*/specviz.json.
# Each step's log goes to LOGS (default out/train, not committed); the committed logs in results/ are listed, with the
# commands that wrote them, in the `# elsewhere:` block of scripts/run_benchmarks.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export HF_HUB_OFFLINE=1
MINUTES=${MINUTES:-28}
LOGS=${LOGS:-out/train}
mkdir -p "$LOGS"
$PY -m specviz.training.drafts data --prompts 2304 --batch 96 --max-new-tokens 160
OMP_NUM_THREADS=1 $PY -m specviz.training.drafts fit --width 96 --layers 2 --heads 4 --epochs 8 --minutes "$MINUTES" \
  --out assets/models/smollm2-draft-s > "$LOGS"/train_draft_s.log 2>&1 &
OMP_NUM_THREADS=1 $PY -m specviz.training.drafts fit --width 128 --layers 4 --heads 4 --epochs 8 --minutes "$MINUTES" \
  --out assets/models/smollm2-draft-m > "$LOGS"/train_draft_m.log 2>&1 &
wait
$PY -m specviz.training.feature_head fit --minutes 30 --out assets/models/smollm2-head > "$LOGS"/train_head_round1.log 2>&1
$PY -m specviz.training.drafts data --prompts 2688 --batch 64 --max-new-tokens 160 --seed 1
$PY -m specviz.training.feature_head fit --minutes 38 --lr 5e-4 --init assets/models/smollm2-head --out assets/models/smollm2-head \
  > "$LOGS"/train_head_round2.log 2>&1
$PY -m specviz.training.drafts data --prompts 10496 --batch 128 --seed 2 --dtype bfloat16
$PY -m specviz.training.feature_head fit --minutes 40 --lr 5e-4 --init assets/models/smollm2-head --out assets/models/smollm2-head \
  > "$LOGS"/train_head.log 2>&1
# round 4: self-written instructions and follow-up turns; then the EAGLE-3-style head (three tapped layers, token loss,
# training-time test over 5 drafting steps), warm-started from the round-3 head, which stays bundled as head-v1
$PY -m specviz.training.drafts data --prompts 12416 --batch 128 --seed 3 --dtype bfloat16 --self-instruct 0.25 --multi-turn 0.25 \
  >> "$LOGS"/train_data_round4.log 2>&1
mv assets/models/smollm2-head assets/models/smollm2-head-v1
$PY -m specviz.training.feature_head fit --minutes "${HEAD_MINUTES:-80}" --taps 2 15 29 --steps-ahead 5 --autocast \
  --init assets/models/smollm2-head-v1 --out assets/models/smollm2-head > "$LOGS"/train_head_v2.log 2>&1
# then the same head trained on for 90 more minutes over the same data, at a lower peak learning rate, in a new order
$PY -m specviz.training.feature_head fit --minutes "${HEAD_MORE_MINUTES:-90}" --lr 2e-4 --seed 1 --taps 2 15 29 --steps-ahead 5 \
  --autocast --init assets/models/smollm2-head --out assets/models/smollm2-head > "$LOGS"/train_head_v3.log 2>&1
tail -n 1 "$LOGS"/train_draft_s.log "$LOGS"/train_draft_m.log "$LOGS"/train_head_v3.log
