#!/usr/bin/env bash
# run2b cut to a call of at most 330 s (device time was short): the gpu tests of the decode kernels, then one
# `vgc bench decode` process of the session's starting main (base/) and one of this code. Every cache starts empty.
# (`python -P`: without it, `python -m` puts the working directory first on sys.path and base/ is never imported.)
set -uo pipefail
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
R=benchmarks/results/issue47-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
PYTHONPATH=. timeout 110 python -m pytest -q tests/ops/test_ops.py -k decode -p no:cacheprovider \
  > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -4 $OUT/gpu_tests.txt
for side in new base; do
  [ $SECONDS -gt 250 ] && { echo "$side skipped at ${SECONDS}s"; continue; }
  P=.; [ $side = base ] && P=$R/base
  PYTHONPATH=$P timeout $(( 325 - SECONDS )) python -P -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --batches 1,8 \
    --prefill 128 --steps 100 2>&1 | grep -v Warning > $OUT/decode_$side.txt
  echo "== $side (${SECONDS}s)"; grep -A3 "^strategy" $OUT/decode_$side.txt
  grep -A1 "GPU kernels per call\|mean launch gap" $OUT/decode_$side.txt
done
echo "done at ${SECONDS}s"
