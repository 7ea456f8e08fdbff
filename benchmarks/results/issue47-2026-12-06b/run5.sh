#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (b), run 5 (the last device seconds): decode 8 and 64 with every fusion on (the
# default: sum, norm, gate and RoPE) against the GEMVs alone, interleaved.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 150 python -m vgc bench decode --interleave --batches 1,8,64 --no-kernel-count --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P unfused" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -12
