#!/usr/bin/env bash
# 2026-12-07, fourth session, first device call: a cold tiered start (`vgc bench startup --strategy tiered`) and a
# plain cold start, the code before the head start (7cbe395, .trees/base) and after it (this main), interleaved
# base, new, base, new; every row a fresh process with every cache empty; bytecode written first for both trees.
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$(mktemp -d)/pyc
ROOT=$PWD
(cd .trees/base && PYTHONPATH=. python -c "import vgc.api, vgc.models.llama, vgc.shells.bench.startup")
PYTHONPATH=. python -c "import vgc.api, vgc.models.llama, vgc.shells.bench.startup"
row() {   # tree strategy label
  local dir=$ROOT; [ $1 = base ] && dir=$ROOT/.trees/base
  (cd $dir && PYTHONPATH=. timeout 150 python -m vgc bench startup --strategy $2 --warm-runs 0 --no-bundle \
     --json $OUT/$3.json 2>&1 | grep -v Warn | tail -4 | tee $OUT/$3.txt)
}
for i in 1 2; do
  row base tiered tiered_base_$i; row new tiered tiered_new_$i
  row base inductor cold_base_$i; row new inductor cold_new_$i
  echo "round $i done at ${SECONDS}s"
done
echo "done at ${SECONDS}s"
