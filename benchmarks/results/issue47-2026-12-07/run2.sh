#!/usr/bin/env bash
# Ran in the second session of 2026-12-07 as its first call (output: h100-b/call2), at e957348; base/ from ab26148. (In the first session only run2e.sh ran, and the bench by hand: h100/.)
# Session of 2026-12-07, the call after this session's changes. Issue 47:
# 1. gpu tests of the decode kernels (the split context merged in its own launch, PDL) and the decode step;
# 2. the input copies before a replay, three ways (copies.py);
# 3. `vgc bench decode` of the default row, processes alternating the main of the session's start (base/: made here by
#    `mkdir -p base && git archive ab26148 vgc | tar -x -C base`, not committed; it travels as an untracked folder)
#    and this session's code: decode 1 and 8, prefill 512, kernels per step and gaps;
# 4. host_path.py (2026-12-06 d) on this session's code.
# Every cache starts empty.
# (`python -P`: without it, `python -m` puts the working directory first on sys.path and base/ is never imported.)
set -uo pipefail
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
R=benchmarks/results/issue47-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
PYTHONPATH=. timeout 170 python -m pytest -q tests/ops/test_ops.py -k decode tests/ops/test_decode_step.py -p no:cacheprovider \
  > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt; tail -4 $OUT/gpu_tests.txt
PYTHONPATH=. timeout 60 python $R/copies.py 2>&1 | grep -v Warning | tee $OUT/copies.txt
for i in 1 2; do
  for side in base new; do
    [ $SECONDS -gt 480 ] && { echo "$side $i skipped at ${SECONDS}s"; continue; }
    P=.; [ $side = base ] && P=$R/base
    PYTHONPATH=$P timeout $(( 560 - SECONDS )) python -P -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --batches 1,8 \
      --steps 200 2>&1 | grep -v Warning > $OUT/decode_${side}_$i.txt
    echo "== $side $i (${SECONDS}s)"; grep -A3 "^strategy" $OUT/decode_${side}_$i.txt
    grep -A1 "GPU kernels per call\|mean launch gap" $OUT/decode_${side}_$i.txt
  done
done
[ $SECONDS -lt 520 ] && PYTHONPATH=. timeout $(( 590 - SECONDS )) python benchmarks/results/issue47-2026-12-06d/host_path.py new 2>&1 \
  | grep -v Warning | tee $OUT/host_new.txt | head -40
echo "done at ${SECONDS}s"
