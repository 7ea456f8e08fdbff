#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (b), run 1: every gpu test with the current default (vgc's one-row GEMV on, PDL on
# its own launch); the decode step, the default against cuBLAS and against Inductor's PDL, interleaved; generate()
# through the integration beside transformers' compiled path.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 280 python -m pytest -q -m gpu tests -p no:cacheprovider --durations=8 > $OUT/gpu_tests.txt 2>&1
echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -25 $OUT/gpu_tests.txt
timeout 180 python -m vgc bench decode --interleave --batches 1,8,64 --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P cuBLAS,vgc F&P + Inductor PDL" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -30
timeout 110 python -m vgc bench generate --batch 1,8 --reps 3 --only "anchor,vgc integration" --json $OUT/generate.json \
    > $OUT/generate.txt 2>&1; echo "generate rc $?" >> $OUT/generate.txt; tail -16 $OUT/generate.txt
