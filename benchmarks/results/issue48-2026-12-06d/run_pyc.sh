#!/usr/bin/env bash
# Session of 2026-12-06 (d), second call, short device budget. Issue 48: warm starts as on an installation that has
# its bytecode (the image sets PYTHONDONTWRITEBYTECODE; here a cold process writes .pyc files under a prefix and
# later processes read them): cold, then warm with the default load, torch's ordinary load, the default again.
# Issue 47: the default decode step's time outside its graph (benchmarks/results/issue47-2026-12-06d/host_path.py).
set -uo pipefail
export PYTHONPATH=.
unset PYTHONDONTWRITEBYTECODE
C=$(mktemp -d); export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
D=benchmarks/results/issue48-2026-12-06d
SPAWNED=$(date +%s.%N) timeout 110 python $D/warm_profile.py cold 2>&1 | tail -1 | tee $OUT/pyc_ab.txt
for flag in 1 0 1; do
  [ $SECONDS -gt 160 ] && { echo "warm $flag skipped at ${SECONDS}s"; continue; }
  VGC_LOAD_WITHOUT_COMPILER=$flag SPAWNED=$(date +%s.%N) timeout 40 python $D/warm_profile.py warm 2>&1 | tail -1 | tee -a $OUT/pyc_ab.txt
done
echo "pyc files: $(find $C/pyc -name '*.pyc' | wc -l)" | tee -a $OUT/pyc_ab.txt
[ $SECONDS -lt 150 ] && timeout $(( 240 - SECONDS )) python benchmarks/results/issue47-2026-12-06d/host_path.py default 2>&1 \
  | grep -v Warning | tee $OUT/host_default.txt | head -50
