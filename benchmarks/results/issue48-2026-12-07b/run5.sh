#!/usr/bin/env bash
# 2026-12-07, fourth session, fifth device call, this main (the copy records transformers' classes): the
# integration's tiered start with its child's log (tiered_integration.py), then the first 45 s of generate()
# (anchor, plain integration, tiered integration), then the integration's startup tests. Every cache empty;
# bytecode written first.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
python -c "import vgc.api, vgc.shells.bench.startup, transformers, vgc.integrations.transformers" 2>/dev/null
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda OUT=$W timeout 150 python -P \
  benchmarks/results/issue48-2026-12-07b/tiered_integration.py 2>&1 | grep -v Warn | tail -8 | tee $W/tiered_integration.txt
echo "generate from ${SECONDS}s"
timeout 220 python -m vgc bench startup --generate 45 --json $W/generate45.json 2>&1 | grep -v Warn | tail -8 \
  | tee $W/generate45.txt
echo "tests from ${SECONDS}s"
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton
timeout $((440 - SECONDS)) python -m pytest -q -p no:cacheprovider tests/integrations/test_startup.py 2>&1 | tail -3 \
  | tee $W/tests.txt
tar czf $OUT/call5.tgz -C $W .
echo "done at ${SECONDS}s"
