#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (b), run 4 (the session's last device minutes): q and k's rotary embedding fused
# into the qkv GEMV (skinny_matmul_rope, off by default): the ops tests on CUDA (the rotation against float64, the
# decoder with it in every graph mode), then the decode step with and without it, interleaved.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 110 python -m pytest -q -m "not extended" tests/ops/test_decode_step.py -k "fused or decoder" \
    -p no:cacheprovider -rA > $OUT/gpu_tests.txt 2>&1
echo "pytest rc $?" >> $OUT/gpu_tests.txt; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc " $OUT/gpu_tests.txt | tail -22
timeout 120 python -m vgc bench decode --interleave --batches 1,8 --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P + fused RoPE" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -20
