#!/usr/bin/env bash
# Issues 49 and 48, session of 2026-12-06 (c): everything in one call, in order of need, each step skipped when
# too little of the call's 600 s is left: (1) the gpu-marked tests of every owner of CUDA graphs after they were
# rebuilt on one core (and the tiered start's first tier on breakable graphs); (2) decode before (4be279c, under
# before/) and after, interleaved by process; (3) where a tiered start's first eager call goes.
set -uo pipefail
HERE=$(pwd)
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 290 python -m pytest -q -p no:cacheprovider -m gpu -rA --durations=20 tests/test_gpu.py tests/cudagraph \
    tests/encoder tests/test_tiered.py tests/integrations/test_decode_loop.py \
    tests/integrations/test_transformers_integration.py 2>&1 | grep -v "torch.__trace" > $OUT/gpu_tests.txt
echo "pytest rc ${PIPESTATUS[0]} at ${SECONDS}s" >> $OUT/gpu_tests.txt
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc " $OUT/gpu_tests.txt | tail -45
ROWS="vgc FULL_AND_PIECEWISE,drop-in FULL_AND_PIECEWISE,breakable + whole decode"
for round in 1 2; do
  for side in before after; do
    [ $SECONDS -gt 430 ] && { echo "decode $side $round skipped at ${SECONDS}s"; continue; }
    dir=$HERE; [ $side = before ] && dir=$HERE/benchmarks/results/issue49-2026-12-06/before
    start=$SECONDS
    (cd $dir && PYTHONPATH=. timeout $(( 560 - SECONDS )) python -m vgc bench decode --interleave --batches 1,8 \
        --prefill 512 --steps 100 --only "$ROWS" --no-kernel-count --json $OUT/decode_${side}_${round}.json) \
        > $OUT/decode_${side}_${round}.txt 2>&1
    echo "decode $side $round rc $? $(( SECONDS - start )) s"
    grep -E "^(vgc|drop|break)" $OUT/decode_${side}_${round}.txt | head -4
  done
done
for v in triton no-triton; do
  [ $SECONDS -gt 540 ] && { echo "first_call $v skipped at ${SECONDS}s"; continue; }
  D=$(mktemp -d); TRITON_CACHE_DIR=$D/triton CUDA_CACHE_PATH=$D/cuda SPAWNED=$(date +%s.%N) timeout $(( 590 - SECONDS )) \
      python benchmarks/results/issue48-2026-12-06c/first_call.py $v 2>&1 | tail -2 | tee -a $OUT/first_call.txt
done
