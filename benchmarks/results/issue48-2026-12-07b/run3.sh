#!/usr/bin/env bash
# 2026-12-07, fourth session, third device call, this main (the swap on the child's report; the child's phases):
# (1) `vgc bench startup` tiered and cold rows interleaved, three rounds; (2) a tiered start serving vs idle while
# its child compiles (idle_or_serving.py); (3) the first 60 s of generate() (anchor, plain integration, tiered
# integration); (4) the gpu tests of the tiered start and the hash records (Triton's on this machine). Every row a fresh process with every
# cache empty; bytecode written first.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
R=benchmarks/results/issue48-2026-12-07b
python -c "import vgc.api, vgc.models.llama, vgc.shells.bench.startup, transformers, vgc.integrations.transformers" 2>/dev/null
for i in 1 2 3; do
  for s in tiered inductor; do
    timeout 150 python -m vgc bench startup --strategy $s --warm-runs 0 --no-bundle --json $W/${s}_$i.json 2>&1 \
      | grep -v Warn | grep "^cold" | sed "s/^/$s $i /" | tee -a $W/rows.txt
  done
done
echo "rows done at ${SECONDS}s" | tee -a $W/rows.txt
for mode in serving idle; do
  C=$(mktemp -d)
  VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor \
    timeout 90 python -P $R/idle_or_serving.py $mode 2>&1 | grep -v Warn | tail -1 | tee -a $W/idle_or_serving.txt
done
echo "generate from ${SECONDS}s" | tee -a $W/rows.txt
timeout 260 python -m vgc bench startup --generate 60 --json $W/generate60.json \
  2>&1 | grep -v Warn | tail -8 | tee $W/generate60.txt
echo "tests from ${SECONDS}s" | tee -a $W/rows.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
timeout $((575 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/test_tiered.py \
  tests/integrations/test_startup.py 2>&1 | tail -4 | tee $W/tests.txt
timeout $((588 - SECONDS)) python -m pytest -q -p no:cacheprovider tests/cache/test_torch_keys.py \
  -k "triton or head_start or cold_start" 2>&1 | tail -4 | tee -a $W/tests.txt
tar czf $OUT/call3.tgz -C $W .
echo "done at ${SECONDS}s"
