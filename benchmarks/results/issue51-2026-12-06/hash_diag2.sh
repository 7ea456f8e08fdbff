#!/usr/bin/env bash
# Issue 51, after .best_config files left the records: a cold llama_1b root, then the check, then a warm start on
# the same root, whose log must hold no "cache:" warning about removed kernels.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda
for run in cold warm; do
timeout 200 python -m vgc bench decode --batches 1 --only "vgc FULL_AND_PIECEWISE" --no-kernel-count \
    > $OUT/decode-$run.txt 2>&1; echo "$run decode rc $?"
grep -c "removed it\|does not match the content hash\|holds other code" $OUT/decode-$run.txt | sed "s/^/$run: kernel warnings /"
python - <<'PY' 2>&1 | tee -a $OUT/check.txt
import os, time
from pathlib import Path
from vgc.cache import kernel_hashes
root = Path(os.environ["VGC_CACHE_ROOT"]); kernels = root / "inductor_cache"
import torch._inductor.codecache  # a start has it loaded before the check
t0 = time.perf_counter()
found = kernel_hashes.mismatches(root, kernels, once=False)
names = set().union(*[set(kernel_hashes.read_record(r) or {}) for r in kernel_hashes.rank_dirs(root)])
print(f"{len(names)} recorded files; check {1000 * (time.perf_counter() - t0):.1f} ms; mismatches {found}")
PY
done
grep -E "vgc FULL" $OUT/decode-*.txt
