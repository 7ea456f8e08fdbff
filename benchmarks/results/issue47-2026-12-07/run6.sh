#!/usr/bin/env bash
# Not run: no machine came. See run7.sh on the change it measures (reverted from main; begun_id_check.patch).
# Second session of 2026-12-07, fifth call (run5.sh's measurements, and the begun id check against 8ea9d63).
# Issue 47: the request-check gpu tests; outside.py (where a decode call's time outside its graph goes), processes
# alternating 8ea9d63 (base/: `mkdir -p base && git archive 8ea9d63 vgc | tar -x -C base`, not committed) and this code.
# Issue 48: a profiled warm start on the GPU with bytecode (warm_profile.py of 2026-12-06 d). Every cache starts empty.
set -uo pipefail
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
R=benchmarks/results/issue47-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
PYTHONPATH=. timeout 90 python -m pytest -q -p no:cacheprovider tests/capture/test_request_checks.py tests/cudagraph/test_dropin_full.py -m gpu 2>&1 | tail -3 | tee $OUT/tests.txt
outside() {   # $1 side, $2 round
  P=.; [ $1 = base ] && P=$R/base
  PYTHONPATH=$P timeout 120 python -P $R/outside.py 1 8 2>&1 | grep -v Warn > $OUT/outside_$1_$2.txt
  echo "== $1 $2 (${SECONDS}s)"; cat $OUT/outside_$1_$2.txt
}
outside base 1; outside new 1
export PYTHONPATH=.
unset PYTHONDONTWRITEBYTECODE
C=$(mktemp -d); export PYTHONPYCACHEPREFIX=$C/pyc VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
D=benchmarks/results/issue48-2026-12-06d
[ $SECONDS -lt 300 ] && SPAWNED=$(date +%s.%N) timeout 80 python $D/warm_profile.py cold 2>&1 | tail -1 | tee $OUT/warm.txt
[ $SECONDS -lt 340 ] && SPAWNED=$(date +%s.%N) timeout 40 python $D/warm_profile.py warm $OUT/warm_profile.txt 2>&1 | tail -1 | tee -a $OUT/warm.txt
[ $SECONDS -lt 370 ] && SPAWNED=$(date +%s.%N) timeout 30 python $D/warm_profile.py warm 2>&1 | tail -1 | tee -a $OUT/warm.txt
export PYTHONPATH=; unset PYTHONPYCACHEPREFIX
[ $SECONDS -lt 420 ] && { outside base 2; outside new 2; }
echo "done at ${SECONDS}s"
