#!/usr/bin/env bash
# Issue 48, session of 2026-12-06: a warm start that loads Inductor's artifacts without importing its compiler.
# (1) the new gpu test (a warm CUDA process, Triton kernels, no compiler module imported); (2) llama_1b warm starts,
# torch's ordinary load (VGC_LOAD_WITHOUT_COMPILER=0) against the default, interleaved by process after one cold
# start, every cache empty at the start of the call, and what the default still imports (-X importtime); (3) `vgc bench startup` cold + 2 warm (fresh caches);
# (4) issue 47: where the default decode step's time goes (benchmarks/profile_decode.py). Each step is skipped
# when too little of the call's 600 s is left.
set -uo pipefail
export PYTHONPATH=.
D=benchmarks/results/issue48-2026-12-06d
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/card.txt
find / -name "*.pyc" -path "*torch/_inductor*" 2>/dev/null | head -2 | sed 's/^/pyc: /' | tee -a $OUT/card.txt
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu -rA tests/cache/test_warm_start.py 2>&1 | tail -8 | tee $OUT/gpu_test.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
SPAWNED=$(date +%s.%N) timeout 150 python $D/warm_profile.py cold 2>&1 | tail -1 | tee $OUT/warm_ab.txt
for round in 1 2 3; do
  for flag in 0 1; do
    [ $SECONDS -gt 380 ] && { echo "warm $flag $round skipped at ${SECONDS}s"; continue; }
    VGC_LOAD_WITHOUT_COMPILER=$flag SPAWNED=$(date +%s.%N) timeout 90 python $D/warm_profile.py warm 2>&1 | tail -1 | tee -a $OUT/warm_ab.txt
  done
done
if [ $SECONDS -lt 400 ]; then   # what a warm start still imports, with the default load
  SPAWNED=$(date +%s.%N) timeout 90 python -X importtime $D/warm_profile.py warm 2> $OUT/importtime.txt | tail -1
  python $D/late_imports.py $OUT/importtime.txt 30 | tee $OUT/late_imports.txt
fi
if [ $SECONDS -lt 400 ]; then
  C2=$(mktemp -d)
  VGC_CACHE_ROOT=$C2/vgc TRITON_CACHE_DIR=$C2/triton CUDA_CACHE_PATH=$C2/cuda TORCHINDUCTOR_CACHE_DIR=$C2/inductor \
    timeout $(( 590 - SECONDS )) python -m vgc bench startup --warm-runs 2 --no-bundle --json $OUT/startup.json > $OUT/startup.txt 2>&1
  echo "startup rc $? at ${SECONDS}s"; tail -12 $OUT/startup.txt
fi
if [ $SECONDS -lt 480 ]; then
  timeout $(( 595 - SECONDS )) python benchmarks/profile_decode.py --variants default > $OUT/profile_decode.txt 2>&1
  echo "profile rc $? at ${SECONDS}s"; head -60 $OUT/profile_decode.txt
fi
