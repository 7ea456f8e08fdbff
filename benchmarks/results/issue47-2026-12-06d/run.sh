#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (d): the default decode step's time outside its graph, with vgc's per-call
# token-id check (the default), then without it (VGC_CHECK_INPUT_IDS=0) when the call has time left. Every cache
# starts empty in the call; the second process loads the first one's artifacts.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
H=benchmarks/results/issue47-2026-12-06d/host_path.py
timeout 160 python $H default 2>&1 | grep -v Warning | tee $OUT/host_default.txt | head -60
[ $SECONDS -lt 170 ] && VGC_CHECK_INPUT_IDS=0 timeout 100 python $H no-id-check 2>&1 | grep "^\[" | tee $OUT/host_nocheck.txt
