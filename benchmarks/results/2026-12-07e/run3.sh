#!/usr/bin/env bash
# 2026-12-07, fifth session: one call for what little device time is left (run1 + run2 in one, by priority, each
# step skipped past its deadline): gpu tests of the begun id check and the tiered start, the integration's tiered
# swap (issue 48), the decode call before (afc2c42, .trees/base) and after, alternated, then the kernel profile.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc
HERE=$PWD
save() { tar czf $OUT/call3.tgz -C $W .; }
PYTHONPATH=. timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/capture/test_request_checks.py \
  tests/test_tiered.py > $W/gpu_tests.txt 2>&1
tail -3 $W/gpu_tests.txt; echo "tests done at ${SECONDS}s"; save
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton PYTHONPATH=. timeout 100 python -P \
  benchmarks/results/issue48-2026-12-07b/tiered_integration.py > $W/tiered_integration.txt 2>&1
grep -v Warn $W/tiered_integration.txt | tail -5; echo "tiered done at ${SECONDS}s"; save
for round in 1 2; do
  for tree in new base; do
    [ $SECONDS -gt 470 ] && break
    C=$(mktemp -d); dir=$HERE; [ $tree = base ] && dir=$HERE/.trees/base
    (cd $dir && VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton PYTHONPATH=. timeout 110 python -m vgc bench decode \
      --only "vgc FULL_AND_PIECEWISE" --batches 1,8 --steps 200 --json $W/decode_${tree}_$round.json) \
      > $W/decode_${tree}_$round.txt 2>&1
    echo "$tree $round: $(grep -A1 '^strategy' $W/decode_${tree}_$round.txt | tail -1)  at ${SECONDS}s"; save
  done
done
if [ $SECONDS -lt 480 ]; then
  C=$(mktemp -d)
  VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton PYTHONPATH=. timeout $((560 - SECONDS)) python \
    benchmarks/profile_graph_kernels.py --batch 1 --json $W/kernels1.json > $W/kernels1.txt 2>&1
  grep -v Warn $W/kernels1.txt | grep -B2 -A14 "^## "; echo "profile done at ${SECONDS}s"
fi
save
