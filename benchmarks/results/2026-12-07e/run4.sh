#!/usr/bin/env bash
# 2026-12-07, fifth session, the last call: the begun id check's gpu tests again (the test fixed), the integration's
# FULL-graph generate, then one more decode pair (new, base) while time is left.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc
HERE=$PWD
save() { tar czf $OUT/call4.tgz -C $W .; }
PYTHONPATH=. timeout 110 python -m pytest -q -p no:cacheprovider -m gpu tests/capture/test_request_checks.py \
  tests/integrations/test_transformers_integration.py -k "begun or full_replay or generate_replays" > $W/gpu_tests.txt 2>&1
tail -3 $W/gpu_tests.txt; echo "tests done at ${SECONDS}s"; save
for tree in new base; do
  [ $SECONDS -gt 150 ] && break
  C=$(mktemp -d); dir=$HERE; [ $tree = base ] && dir=$HERE/.trees/base
  (cd $dir && VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton PYTHONPATH=. timeout 60 python -m vgc bench decode \
    --only "vgc FULL_AND_PIECEWISE" --batches 1,8 --steps 200 --json $W/decode_${tree}_3.json) > $W/decode_${tree}_3.txt 2>&1
  echo "$tree 3: $(grep -A1 '^strategy' $W/decode_${tree}_3.txt | tail -1)  at ${SECONDS}s"; save
done
save
