#!/usr/bin/env bash
# 2026-12-07, fourth session, last device call (little device time left), this main (the copy records
# transformers' classes): the integration's tiered start with its child's log (tiered_integration.py), then the
# tiered row of `vgc bench startup --generate` alone (its child entry, a 40 s window). Every cache empty.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
python -c "import vgc.api, vgc.shells.bench.startup, transformers, vgc.integrations.transformers" 2>/dev/null
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda OUT=$W timeout 100 python -P \
  benchmarks/results/issue48-2026-12-07b/tiered_integration.py 2>&1 | grep -v Warn | tail -8 | tee $W/tiered_integration.txt
echo "row from ${SECONDS}s"
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda timeout 80 python -m vgc.shells.bench.first_minute \
  --child "vgc integration tiered" llama_1b cuda 40 $(date +%s.%N) 2>/dev/null | tail -1 | tee $W/tiered_row.json
tar czf $OUT/call6.tgz -C $W .
echo "done at ${SECONDS}s"
