#!/usr/bin/env bash
# Third session of 2026-12-07, fourth device call, this main: a cold process then three warm ones (bytecode under a
# prefix): the first warm process should no longer hash Triton (the cold start records it when it opens its
# store). Then a cold tiered start's warmup() and first call under cProfile (tiered_first_call.py).
set -uo pipefail
unset PYTHONDONTWRITEBYTECODE
R=benchmarks/results/issue48-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
C=$(mktemp -d); export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor PYTHONPATH=.
for mode in cold warm warm warm; do
  SPAWNED=$(date +%s.%N) timeout 120 python -P $R/warm_triton.py $mode 2>&1 | tail -2 | tee -a $OUT/warm.txt
done
ls $C/vgc | tee -a $OUT/warm.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
timeout 100 python -P $R/tiered_first_call.py $OUT/tiered_first_call.prof.txt 2>&1 | grep -v Warn | tail -3 | tee $OUT/tiered.txt
echo "done at ${SECONDS}s"
