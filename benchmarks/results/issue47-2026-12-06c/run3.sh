#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (c), run 3: every gpu-marked test on the final tree, then the reference decoder's
# decode step (the default against the GEMVs alone, interleaved) to check the matcher's rewrite changed nothing there.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
echo "load before: $(cat /proc/loadavg)" | tee $OUT/load.txt
timeout 380 python -m pytest -m gpu -q -p no:cacheprovider tests > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc $?" >> $OUT/gpu_tests.txt; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests.txt | tail -12
timeout 170 python -m vgc bench decode --interleave --batches 1,8 --json $OUT/decode.json \
    --only "vgc FULL_AND_PIECEWISE,vgc F&P unfused" > $OUT/decode.txt 2>&1
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -10
