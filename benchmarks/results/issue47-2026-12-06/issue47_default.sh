#!/usr/bin/env bash
# Issue 47 item 1, run 2: vgc's matmul kernel and PDL as the default. The gpu tests first; then the decode step,
# the new default against the old one (cuBLAS, no PDL) and cuBLAS with PDL, interleaved; then generate() through
# the integration beside transformers' compiled path; last the kernel's tiles for 2-8 rows.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 150 python -m pytest -q -m gpu tests/ops tests/integrations/test_decode_loop.py -p no:cacheprovider \
    > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -3 $OUT/gpu_tests.txt
timeout 240 python -m vgc bench decode --interleave --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P cuBLAS,vgc F&P cuBLAS + PDL" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -28
timeout 150 python -m vgc bench generate --batch 1,8 --reps 3 --only "anchor,vgc integration" --json $OUT/generate.json \
    > $OUT/generate.txt 2>&1; echo "generate rc $?" >> $OUT/generate.txt; tail -16 $OUT/generate.txt
timeout 60 python benchmarks/sweep_skinny_mm.py --rows 2,8 --json $OUT/sweep.json > $OUT/sweep.txt 2>&1
echo "sweep rc $?" >> $OUT/sweep.txt; grep -v "OutOfResources" $OUT/sweep.txt | tail -20
