#!/usr/bin/env bash
# run2c cut to a call of at most 200 s: the gpu tests of the decode-attention kernels, then one `vgc bench decode`
# process of this code (kernels per step). Every cache starts empty.
set -uo pipefail
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
# test_ops.py's kernel tests run on CUDA where there is one (not gpu-marked: Triton's interpreter serves them on a CPU)
PYTHONPATH=. timeout 60 python -m pytest -q tests/ops/test_ops.py -k "decode" -p no:cacheprovider \
  > $OUT/kernel_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/kernel_tests.txt; tail -3 $OUT/kernel_tests.txt
PYTHONPATH=. timeout 50 python -m pytest -q -m gpu tests/ops/test_decode_step.py -k "every_graph_mode and default" \
  -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -3 $OUT/gpu_tests.txt
PYTHONPATH=. timeout $(( 195 - SECONDS )) python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --batches 1,8 \
  --prefill 128 --steps 100 2>&1 | grep -v Warning > $OUT/decode_new.txt
grep -A3 "^strategy" $OUT/decode_new.txt; grep -A1 "GPU kernels per call\|mean launch gap" $OUT/decode_new.txt
echo "done at ${SECONDS}s"
