#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (c), run 1: transformers' RoPE spelling and the symbolic-size residual sums fused
# into the integration's GEMVs. GPU tests of the fused kernels, the passes and the integration, then generate() at
# batch 1 and 8: the anchor, the integration (every fusion), RoPE apart, and unfused (the rows interleaved).
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 220 python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_decode_step.py tests/passes \
    tests/integrations/test_transformers_integration.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc $?" >> $OUT/gpu_tests.txt; tail -4 $OUT/gpu_tests.txt
timeout 340 python -m vgc bench generate --batch 1,8 --reps 3 --json $OUT/generate.json \
    --only "anchor,vgc integration,vgc integration (RoPE apart),vgc integration unfused" > $OUT/generate.txt 2>&1
echo "generate rc $?" >> $OUT/generate.txt; grep -v "^  \|Warning\|warn" $OUT/generate.txt | tail -16
