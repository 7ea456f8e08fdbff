#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (c), run 2: run 1's generate() rows again (its host was loaded: eager took 18.5
# ms/token against 10.1 the day before), five timed calls per row, the host's load average recorded before and after.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
echo "load before: $(cat /proc/loadavg), $(nproc) cores" | tee $OUT/load.txt
timeout 420 python -m vgc bench generate --batch 1,8 --reps 5 --json $OUT/generate.json \
    --only "anchor,vgc integration,vgc integration unfused" > $OUT/generate.txt 2>&1
echo "generate rc $?" >> $OUT/generate.txt; grep -v "^  \|Warning\|warn" $OUT/generate.txt | tail -16
echo "load after: $(cat /proc/loadavg)" | tee -a $OUT/load.txt
