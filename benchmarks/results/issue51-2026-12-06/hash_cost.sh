#!/usr/bin/env bash
# Issue 51: what the start-time kernel check costs on a real CUDA root. A cold `vgc bench decode` of llama_1b fills
# a root (vgc's entry and Inductor's/Triton's files under it); then fresh processes hash every file the records
# name, as a start does once per process (and as `vgc cache verify` does), three times.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 200 python -m vgc bench decode --batches 1 --only "vgc FULL_AND_PIECEWISE" --no-kernel-count \
    > $OUT/decode.txt 2>&1; echo "decode rc $?" | tee -a $OUT/decode.txt
for i in 1 2 3; do
python - <<'PY' 2>&1 | tee -a $OUT/hash_cost.txt
import os, time
from pathlib import Path
t0 = time.perf_counter()
from vgc.cache import kernel_hashes
imported = time.perf_counter() - t0
root = Path(os.environ["VGC_CACHE_ROOT"]); kernels = root / "inductor_cache"
names = set()
for rank in kernel_hashes.rank_dirs(root):
    names |= set(kernel_hashes.read_record(rank) or {})
size = sum((kernels / n).stat().st_size for n in names if (kernels / n).is_file())
modules = sum(1 for n in names if kernel_hashes.named_module(n))
t0 = time.perf_counter()
found = kernel_hashes.mismatches(root, kernels, once=True)
took = time.perf_counter() - t0
print(f"{len(names)} recorded files ({modules} generated modules), {size / 1e6:.1f} MB; check {took * 1000:.0f} ms "
      f"(import {imported * 1000:.0f} ms); {len(found)} mismatches")
PY
done
