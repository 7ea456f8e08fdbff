#!/usr/bin/env bash
# Third session of 2026-12-07, third device call, this main: `vgc bench startup` with bytecode written under a
# prefix by the cold process (cold, warm x3, bundle), then the tiered row, then every gpu-marked test.
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$C/pyc PYTHONPATH=.
timeout 200 python -m vgc bench startup --warm-runs 3 --json $OUT/startup.json 2>&1 | grep -v Warn | tee $OUT/startup.txt | tail -25
echo "pyc files: $(find $C/pyc -name '*.pyc' | wc -l) at ${SECONDS}s"
C2=$(mktemp -d); export VGC_CACHE_ROOT=$C2/vgc TRITON_CACHE_DIR=$C2/triton CUDA_CACHE_PATH=$C2/cuda TORCHINDUCTOR_CACHE_DIR=$C2/inductor
[ $SECONDS -lt 200 ] && timeout 150 python -m vgc bench startup --strategy tiered --warm-runs 0 --no-bundle --json $OUT/tiered.json 2>&1 | grep -v Warn | tee $OUT/tiered.txt | tail -15
echo "tests from ${SECONDS}s"
unset PYTHONPYCACHEPREFIX; export PYTHONDONTWRITEBYTECODE=1
timeout $((585 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -8 | tee $OUT/gpu_tests.txt
echo "done at ${SECONDS}s"
