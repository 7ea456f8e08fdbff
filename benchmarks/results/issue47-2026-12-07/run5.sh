#!/usr/bin/env bash
# Second session of 2026-12-07, fifth call. Issue 47: outside.py (where a decode call's time outside its graph goes,
# decode 1 and 8). Issue 48: where a warm start's warmup() goes on the GPU, with bytecode (warm_profile.py of
# 2026-12-06 d: one cold start, then warm starts, one under cProfile). Every cache starts empty.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
R=benchmarks/results/issue47-2026-12-07
timeout 200 python $R/outside.py 1 8 2>&1 | grep -v Warn | tee $OUT/outside.txt
unset PYTHONDONTWRITEBYTECODE
C=$(mktemp -d); export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
D=benchmarks/results/issue48-2026-12-06d
SPAWNED=$(date +%s.%N) timeout 110 python $D/warm_profile.py cold 2>&1 | tail -1 | tee $OUT/warm.txt
SPAWNED=$(date +%s.%N) timeout 40 python $D/warm_profile.py warm 2>&1 | tail -1 | tee -a $OUT/warm.txt
SPAWNED=$(date +%s.%N) timeout 60 python $D/warm_profile.py warm $OUT/warm_profile.txt 2>&1 | tail -1 | tee -a $OUT/warm.txt
SPAWNED=$(date +%s.%N) timeout 40 python $D/warm_profile.py warm 2>&1 | tail -1 | tee -a $OUT/warm.txt
echo "done at ${SECONDS}s"
