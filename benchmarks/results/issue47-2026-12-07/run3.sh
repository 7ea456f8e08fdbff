#!/usr/bin/env bash
# Ran in the second session of 2026-12-07 as its second call (output: h100-b/call3), at e957348.
# Session of 2026-12-07, third call. Issue 47: the one-row matmul tiles chosen inside the PDL chain of a decode step
# (benchmarks/sweep_chain_tiles.py), then the default decode step with the shipped tiles against the chosen ones,
# one process, interleaved (decode_tiles.py). Every cache starts empty.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
R=benchmarks/results/issue47-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
timeout 330 python benchmarks/sweep_chain_tiles.py --budget-s 260 --json $OUT/chain_tiles.json 2>&1 | grep -v Warning | tee $OUT/chain_tiles.txt
[ -f $OUT/chain_tiles.json ] && timeout $(( 585 - SECONDS )) python $R/decode_tiles.py $OUT/chain_tiles.json 2>&1 | grep -v Warning | tee $OUT/decode_tiles.txt | tail -4
echo "done at ${SECONDS}s"
