#!/usr/bin/env bash
# 2026-12-07, fourth session, second device call: (1) a cold tiered start's first call (first_call.py), the code
# before the head start (7cbe395, .trees/base) and after (this main) alternated, four each, every cache empty;
# (2) `vgc bench startup` tiered and cold rows of this main interleaved, three rounds, plus two tiered rows of the
# base; every row a fresh process with every cache empty. Results in one archive.
set -uo pipefail
W=$(mktemp -d); nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc
ROOT=$PWD; R=$ROOT/benchmarks/results/issue48-2026-12-07b
(cd .trees/base && PYTHONPATH=. python -c "import vgc.api, vgc.models.llama, vgc.shells.bench.startup")
PYTHONPATH=. python -c "import vgc.api, vgc.models.llama, vgc.shells.bench.startup"
dir_of() { [ $1 = base ] && echo $ROOT/.trees/base || echo $ROOT; }
for i in 1 2 3 4; do
  for tree in base new; do
    C=$(mktemp -d)
    (cd $(dir_of $tree) && VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda \
     TORCHINDUCTOR_CACHE_DIR=$C/inductor PYTHONPATH=. timeout 60 python -P $R/first_call.py $tree-$i 2>&1 \
     | grep -v Warn | tail -1 | tee -a $W/first_call.txt)
  done
done
echo "first calls done at ${SECONDS}s" | tee -a $W/first_call.txt
row() {   # tree strategy label
  (cd $(dir_of $1) && PYTHONPATH=. timeout 150 python -m vgc bench startup --strategy $2 --warm-runs 0 --no-bundle \
     --json $W/$3.json 2>&1 | grep -v Warn | tail -4 | sed -n 2,3p | sed "s/^/$3 /" | tee -a $W/rows.txt)
}
for i in 1 2 3; do
  row new tiered tiered_new_$i; row new inductor cold_new_$i
  [ $i -le 2 ] && row base tiered tiered_base_$i
  echo "round $i done at ${SECONDS}s" | tee -a $W/rows.txt
done
tar czf $OUT/call2.tgz -C $W .
echo "done at ${SECONDS}s"
