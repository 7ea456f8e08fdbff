#!/usr/bin/env bash
# Third session of 2026-12-07, second device call. Issue 48: GPU warm starts with bytecode, c3d4b2c (.trees/base,
# carried, never committed) against this main (Triton's key remembered, the faster files signature), interleaved,
# each side its own empty caches and a cold process first; then one profiled warm start of each with callers.
# Then the key-memory tests on the card (Triton and torch 2.11 there).
set -uo pipefail
unset PYTHONDONTWRITEBYTECODE
R=benchmarks/results/issue48-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
side_env() {
  C=/tmp/c_$1; mkdir -p $C
  export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
}
tree() { [ $1 = base ] && echo .trees/base || echo .; }
for side in base new; do
  side_env $side
  PYTHONPATH=$(tree $side) SPAWNED=$(date +%s.%N) timeout 120 python -P $R/warm_triton.py cold 2>&1 | tail -2 | sed "s/^/$side /" | tee -a $OUT/warm.txt
done
for i in 1 2 3 4; do for side in base new; do
  [ $SECONDS -gt 260 ] && continue
  side_env $side
  PYTHONPATH=$(tree $side) SPAWNED=$(date +%s.%N) timeout 40 python -P $R/warm_triton.py warm 2>&1 | tail -2 | sed "s/^/$side /" | tee -a $OUT/warm.txt
done; done
for side in new base; do
  side_env $side
  PYTHONPATH=$(tree $side) timeout 40 python -P $R/warm_triton.py warm $OUT/warm_$side.prof.txt 2>&1 | tail -2 | sed "s/^/$side profiled /" | tee -a $OUT/warm.txt
done
echo "${SECONDS}s" | tee -a $OUT/warm.txt
unset PYTHONPYCACHEPREFIX; export PYTHONDONTWRITEBYTECODE=1
PYTHONPATH=. timeout 200 python -m pytest -q -p no:cacheprovider tests/cache/test_torch_keys.py 2>&1 | tail -3 | tee $OUT/tests.txt
echo "done at ${SECONDS}s"
