#!/usr/bin/env bash
# 2026-12-07, fifth session, call 1: issue 48's integration tiered swap on the card (tiered_integration.py, the
# class-record fix), the gpu tests of the tiered start and the begun id check, then the kernels of both FULL decode graphs (issue 47).
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
python -c "import vgc, torch, transformers; print(torch.__version__, transformers.__version__)" | tee -a $W/card.txt
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda timeout 100 python -P \
  benchmarks/results/issue48-2026-12-07b/tiered_integration.py > $W/tiered_integration.txt 2>&1
tail -8 $W/tiered_integration.txt; echo "tiered done at ${SECONDS}s"
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_tiered.py tests/integrations/test_startup.py \
  tests/cache/test_torch_keys.py tests/capture/test_request_checks.py > $W/gpu_tests.txt 2>&1; tail -3 $W/gpu_tests.txt; echo "tests done at ${SECONDS}s"
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton timeout 200 python benchmarks/profile_graph_kernels.py --batch 1 \
  --json $W/kernels1.json > $W/kernels1.txt 2>&1; grep -v Warn $W/kernels1.txt | head -60; echo "profile done at ${SECONDS}s"
tar czf $OUT/call1.tgz -C $W .
