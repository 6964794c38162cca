#!/usr/bin/env bash
# One command that proves the engine's GPU path on one H100 or H200 in under 8 minutes, with no network: the CUDA subset
# of the tests, greedy exactness against generate in fp32 (random 135M-shape target; tiny targets with synthetic EAGLE-3
# heads) and the costs of a random Qwen3-8B-shape target in bf16. Writes results/cuda/<date>-<gpu>.{md,csv}.
#   bash scripts/gpu_check.sh [--tokens N] [--rounds R] [--before OLD_LEAN_PY]      (PYTHON=... picks the interpreter; default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SPECVIZ_COMMIT="${SPECVIZ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
  timeout 470 "${PYTHON:-python3}" scripts/gpu_check.py "$@"
