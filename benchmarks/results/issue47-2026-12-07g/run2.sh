#!/usr/bin/env bash
# Seventh session of 2026-12-07, call 2 (on the machine of call 1): the kernels of both FULL decode graphs at batch 1
# (vgc's Llama, and the integration's transformers Llama with the strided values and the outer_products pass), a
# decode call's host timeline (outside.py of the third session), and `vgc bench decode` at decode 1 and 8.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc PYTHONPATH=.
save() { tar czf $OUT/call2.tgz -C $W .; }
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
timeout 200 python benchmarks/profile_graph_kernels.py --batch 1 --json $W/kernels1.json > $W/kernels1.txt 2>&1
grep -v Warn $W/kernels1.txt | grep -A14 "^## "; echo "profile done at ${SECONDS}s"; save
timeout 150 python benchmarks/results/issue47-2026-12-07/outside.py 1 > $W/outside.txt 2>&1; tail -14 $W/outside.txt
echo "outside done at ${SECONDS}s"; save
for round in 1 2; do
  [ $SECONDS -gt 450 ] && break
  C=$(mktemp -d)
  VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor timeout $(( 585 - SECONDS )) \
    python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --batches 1,8 --steps 200 --json $W/decode_$round.json \
    > $W/decode_$round.txt 2>&1
  echo "decode $round: $(grep -A1 '^strategy' $W/decode_$round.txt | tail -1) at ${SECONDS}s"; save
done
