#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (b), run 3: the fusion pass with the residual add moved before the norm (into the
# next matmul, so that more rows keep Inductor's kernel count): its tests, the decode step (default / + fused /
# + fused + Inductor PDL, interleaved) and generate() through the integration with and without it.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 130 python -m pytest -q -m "not extended" tests/ops/test_decode_step.py tests/passes/test_skinny_fusion.py \
    -p no:cacheprovider -rA > $OUT/gpu_tests.txt 2>&1
echo "pytest rc $?" >> $OUT/gpu_tests.txt; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc " $OUT/gpu_tests.txt | tail -30
timeout 180 python -m vgc bench decode --interleave --batches 1,8,64 --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P + fused matmuls,vgc F&P + fused + Inductor PDL" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -24
timeout 130 python -m vgc bench generate --batch 1 --reps 3 --json $OUT/generate.json \
    --only "anchor,vgc integration,vgc integration + fused matmuls" > $OUT/generate.txt 2>&1
echo "generate rc $?" >> $OUT/generate.txt; tail -12 $OUT/generate.txt
