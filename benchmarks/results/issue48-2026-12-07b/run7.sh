#!/usr/bin/env bash
# 2026-12-07, fourth session, last device call (about 2 min of device time left): the integration's tiered start
# (tiered_integration.py) on this main, whose copy records transformers' classes and walks only modules.
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda timeout 75 python -P \
  benchmarks/results/issue48-2026-12-07b/tiered_integration.py 2>&1 | grep -v Warn | tail -8 | tee $OUT/tiered_integration.txt
echo "done at ${SECONDS}s"
