#!/usr/bin/env bash
# Seventh session of 2026-12-07, a short call for the little device time left: the
# kernels of both FULL decode graphs at batch 1 (the integration's with the strided values and outer_products),
# and the integration's gpu test of its fused GEMVs.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
save() { tar czf $OUT/call3.tgz -C $W .; }
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
timeout 150 python benchmarks/profile_graph_kernels.py --batch 1 --json $W/kernels1.json > $W/kernels1.txt 2>&1
grep -v Warn $W/kernels1.txt | grep -A14 "^## "; echo "profile done at ${SECONDS}s"; save
timeout $(( 270 - SECONDS )) python -m pytest -q -p no:cacheprovider -m gpu -rs \
  tests/integrations/test_transformers_integration.py -k fused_gemvs > $W/gpu_tests.txt 2>&1
tail -3 $W/gpu_tests.txt; echo "done at ${SECONDS}s"; save
