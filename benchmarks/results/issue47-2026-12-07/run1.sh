#!/usr/bin/env bash
# Ran in the second session of 2026-12-07 as that session's third call (output: h100-b/call4), at e957348.
# Session of 2026-12-07, first call. Issue 47: where a default decode call spends its time outside the graph
# (host_path.py of 2026-12-06 d, with and without the token-id check). Issue 48: warm starts with bytecode
# (run_pyc.sh's measurement). Every cache starts empty.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
H=benchmarks/results/issue47-2026-12-06d/host_path.py
timeout 200 python $H default 2>&1 | grep -v Warning | tee $OUT/host_default.txt | head -60
[ $SECONDS -lt 260 ] && VGC_CHECK_INPUT_IDS=0 timeout 120 python $H no-id-check 2>&1 | grep -v Warning | tee $OUT/host_nocheck.txt | grep "^\["
# run_pyc.sh's warm starts, without its own host_path run: bytecode written under a prefix by the cold process
if [ $SECONDS -lt 330 ]; then
  unset PYTHONDONTWRITEBYTECODE
  C=$(mktemp -d); export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
  D=benchmarks/results/issue48-2026-12-06d
  SPAWNED=$(date +%s.%N) timeout 110 python $D/warm_profile.py cold 2>&1 | tail -1 | tee $OUT/pyc_ab.txt
  for flag in 1 0 1 0 1; do
    [ $SECONDS -gt 560 ] && { echo "warm $flag skipped at ${SECONDS}s"; continue; }
    VGC_LOAD_WITHOUT_COMPILER=$flag SPAWNED=$(date +%s.%N) timeout 40 python $D/warm_profile.py warm 2>&1 | tail -1 | tee -a $OUT/pyc_ab.txt
  done
  echo "pyc files: $(find $C/pyc -name '*.pyc' | wc -l)" | tee -a $OUT/pyc_ab.txt
fi
echo "done at ${SECONDS}s"
