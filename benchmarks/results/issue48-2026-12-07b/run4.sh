#!/usr/bin/env bash
# 2026-12-07, fourth session, fourth device call: the transformers integration's tiered start on the H100 with its
# child's whole log (tiered_integration.py), every cache empty.
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda PYTHONPATH=.
timeout 200 python -P benchmarks/results/issue48-2026-12-07b/tiered_integration.py 2>&1 | grep -v Warn | tail -40 | tee $OUT/tiered_integration.txt
echo "done at ${SECONDS}s"
