#!/usr/bin/env bash
# The tests of run2.sh, cut to a call of at most 130 s (device time was short): the decode-attention kernels on CUDA and the decoder in every graph mode. Ran on an H100 (h100/).
# Every cache starts empty.
set -uo pipefail
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
# test_ops.py's kernel tests run on CUDA where there is one (not gpu-marked: Triton's interpreter serves them on a CPU)
PYTHONPATH=. timeout 60 python -m pytest -q tests/ops/test_ops.py -k "decode" -p no:cacheprovider \
  > $OUT/kernel_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/kernel_tests.txt; tail -3 $OUT/kernel_tests.txt
PYTHONPATH=. timeout 50 python -m pytest -q -m gpu tests/ops/test_decode_step.py -k "every_graph_mode and default" \
  -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -3 $OUT/gpu_tests.txt
echo "done at ${SECONDS}s"
