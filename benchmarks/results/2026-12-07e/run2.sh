#!/usr/bin/env bash
# 2026-12-07, fifth session, call 2: the decode call before (afc2c42, in .trees/base) and after this session's host
# work (the id check ended after the replay, the one-call tensor check, the pinned reader), processes alternated.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc
HERE=$PWD
for round in 1 2; do
  for tree in base new; do
    C=$(mktemp -d); dir=$HERE; [ $tree = base ] && dir=$HERE/.trees/base
    (cd $dir && VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton PYTHONPATH=. timeout 200 python -m vgc bench decode \
      --only "vgc FULL_AND_PIECEWISE" --batches 1,8 --steps 200 --json $W/decode_${tree}_$round.json) \
      > $W/decode_${tree}_$round.txt 2>&1
    echo "$tree $round: $(grep -A3 '^strategy' $W/decode_${tree}_$round.txt | tail -1)  at ${SECONDS}s"
  done
done
tar czf $OUT/call2.tgz -C $W .
