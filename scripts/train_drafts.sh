#!/usr/bin/env bash
# Rebuilds the bundled drafts: target answers (resumable, shards under assets/distill/data), then both drafts
# trained side by side on one torch thread each, then the feature head on both threads. MINUTES caps each fit; the committed drafts used the values
# recorded in assets/models/*/specviz.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export HF_HUB_OFFLINE=1
PROMPTS=${PROMPTS:-2304}
MINUTES=${MINUTES:-28}
$PY -m specviz.train data --prompts "$PROMPTS" --batch 96 --max-new-tokens 160
OMP_NUM_THREADS=1 $PY -m specviz.train fit --width 96 --layers 2 --heads 4 --epochs 8 --minutes "$MINUTES" \
  --out assets/models/smollm2-draft-s > results/train_draft_s.log 2>&1 &
OMP_NUM_THREADS=1 $PY -m specviz.train fit --width 128 --layers 4 --heads 4 --epochs 8 --minutes "$MINUTES" \
  --out assets/models/smollm2-draft-m > results/train_draft_m.log 2>&1 &
wait
$PY -m specviz.train head --minutes 30 --out assets/models/smollm2-head > results/train_head.log 2>&1
tail -n 1 results/train_draft_s.log results/train_draft_m.log results/train_head.log
