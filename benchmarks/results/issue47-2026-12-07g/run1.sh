#!/usr/bin/env bash
# Seventh session of 2026-12-07, call 1: gpu tests of what changed or was never run
# on a card (begun id check, the decoder's GEMVs, the integration's fused GEMVs and replays), then `vgc bench
# generate` at batch 1 and 8: the anchor, the integration, and the integration with the outer_products pass off.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
save() { tar czf $OUT/call1.tgz -C $W .; }
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
timeout 130 python -m pytest -q -p no:cacheprovider -m gpu -rs tests/capture/test_request_checks.py \
  tests/ops/test_decode_step.py tests/integrations/test_transformers_integration.py tests/test_compat.py \
  tests/passes > $W/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $W/gpu_tests.txt
tail -8 $W/gpu_tests.txt; echo "tests done at ${SECONDS}s"; save
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
timeout $(( 560 - SECONDS )) python -m vgc bench generate --batch 1,8 --reps 3 \
  --only "anchor,vgc integration,vgc integration (matmul angles)" --json $W/generate.json 2>&1 \
  | grep -v Warning > $W/generate.txt
tail -32 $W/generate.txt; echo "done at ${SECONDS}s"; save
