#!/usr/bin/env bash
# Third session of 2026-12-07, one device call. Trees carried in .trees/ (ignored, never committed):
#   .trees/base    = e957348's vgc (before the remembered C++ header and the unevaluated shape guards)
#   .trees/patched = this main's vgc + benchmarks/results/issue47-2026-12-07/begun_id_check.patch (and its tests)
# Issue 48: GPU warm starts with bytecode, base and new interleaved (each side its own empty caches, a cold process
# first), then one profiled warm start of new. Issue 47: the begun-id-check gpu tests; outside.py at decode 1,
# new / patched / new / patched (each side its own caches).
set -uo pipefail
unset PYTHONDONTWRITEBYTECODE
R47=benchmarks/results/issue47-2026-12-07; D=benchmarks/results/issue48-2026-12-06d
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
side_env() {  # caches of one side
  C=/tmp/c_$1; mkdir -p $C
  export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
}
tree() { case $1 in base) echo .trees/base;; patched) echo .trees/patched;; *) echo .;; esac; }
for side in base new; do
  side_env w$side
  PYTHONPATH=$(tree $side) SPAWNED=$(date +%s.%N) timeout 120 python -P $D/warm_profile.py cold 2>&1 | tail -1 | sed "s/^/$side /" | tee -a $OUT/warm.txt
done
for i in 1 2 3; do for side in base new; do
  [ $SECONDS -gt 200 ] && continue
  side_env w$side
  PYTHONPATH=$(tree $side) SPAWNED=$(date +%s.%N) timeout 40 python -P $D/warm_profile.py warm 2>&1 | tail -1 | sed "s/^/$side /" | tee -a $OUT/warm.txt
done; done
side_env wnew
PYTHONPATH=. timeout 40 python -P $D/warm_profile.py warm $OUT/warm_new.prof.txt 2>&1 | tail -1 | tee -a $OUT/warm.txt
echo "pyc files: $(find /tmp/c_wnew/pyc -name '*.pyc' | wc -l); ${SECONDS}s" | tee -a $OUT/warm.txt
unset PYTHONPYCACHEPREFIX; export PYTHONDONTWRITEBYTECODE=1
(cd .trees/patched && PYTHONPATH=. timeout 60 python -P -m pytest -q -p no:cacheprovider tests/capture/test_request_checks.py -m gpu 2>&1 | tail -2) | tee $OUT/tests_patched.txt
for side in new patched new patched; do
  [ $SECONDS -gt 520 ] && { echo "$side skipped at ${SECONDS}s"; continue; }
  side_env o$side
  PYTHONPATH=$(tree $side) timeout 80 python -P $R47/outside.py 1 2>&1 | grep -v Warn | tee -a $OUT/outside_$side.txt
  echo "== $side done (${SECONDS}s)"
done
echo "done at ${SECONDS}s"
