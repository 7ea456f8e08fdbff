#!/usr/bin/env bash
# Third session of 2026-12-07: measured instead by benchmarks/results/issue48-2026-12-07/run8.sh (begun check and outside.py
# on one H100): no gain, the patch stays out (docs/benchmarks-log.md).
# Not run: no machine came (run6.sh neither). The change it measures was reverted from main (e28e125, reverted by the
# next commit; begun_id_check.patch here): to run it, `git apply` the patch in a checkout and make base/ from its parent.
# Second session of 2026-12-07: run6.sh cut to what 290 s of device time allows (run6 never got a machine): the
# request-check gpu tests, then outside.py at decode 1 on 8ea9d63 (base/, as in run6.sh) and on this code.
set -uo pipefail
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
R=benchmarks/results/issue47-2026-12-07
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
PYTHONPATH=. timeout 40 python -m pytest -q -p no:cacheprovider tests/capture/test_request_checks.py -m gpu 2>&1 | tail -2 | tee $OUT/tests.txt
for side in base new; do
  P=.; [ $side = base ] && P=$R/base
  PYTHONPATH=$P timeout 70 python -P $R/outside.py 1 2>&1 | grep -v Warn > $OUT/outside_$side.txt
  echo "== $side (${SECONDS}s)"; cat $OUT/outside_$side.txt
done
echo "done at ${SECONDS}s"
