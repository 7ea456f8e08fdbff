#!/usr/bin/env bash
# Session of 2026-12-07 (second), fourth call, on the warm machine of run2/3/1. Issue 47: every gpu-marked test, then
# `vgc bench generate` at batch 1 and 8 (transformers' compiled path against the integration). Caches as left by the
# earlier calls of this machine (each of those set its own empty cache dirs; this one sets new empty ones).
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider -rs tests > $OUT/gpu_all.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_all.txt
tail -15 $OUT/gpu_all.txt
timeout $(( 590 - SECONDS )) python -m vgc bench generate --batch 1,8 --reps 3 --only "anchor,vgc integration" 2>&1 \
  | grep -v Warning | tee $OUT/generate.txt | tail -30
echo "done at ${SECONDS}s"
