#!/usr/bin/env bash
# Issue 47 item 1, run 2 (lean: little device time was left): the kernel's gpu tests with the new default (2-8 rows
# on the CUDA-core kernel), then the decode step, the new default against the old one (cuBLAS, no PDL) and cuBLAS
# with PDL, interleaved; then generate() through the integration beside transformers' compiled path.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 80 python -m pytest -q -m gpu tests/ops/test_decode_step.py -p no:cacheprovider \
    > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -3 $OUT/gpu_tests.txt
timeout 200 python -m vgc bench decode --interleave --batches 1,8,64 --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P cuBLAS,vgc F&P + Inductor PDL" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -28
timeout 150 python -m vgc bench generate --batch 1,8 --reps 3 --only "anchor,vgc integration" --json $OUT/generate.json \
    > $OUT/generate.txt 2>&1; echo "generate rc $?" >> $OUT/generate.txt; tail -16 $OUT/generate.txt
timeout 60 python benchmarks/sweep_skinny_mm.py --rows 8 --json $OUT/sweep8.json > $OUT/sweep8.txt 2>&1
echo "sweep rc $?" >> $OUT/sweep8.txt; grep -v "OutOfResources" $OUT/sweep8.txt | tail -12
