#!/usr/bin/env bash
# Issue 51: hash_cost.sh found 4 mismatches on an intact llama_1b CUDA root: which files, and why.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda
timeout 200 python -m vgc bench decode --batches 1 --only "vgc FULL_AND_PIECEWISE" --no-kernel-count \
    > $OUT/decode.txt 2>&1; echo "decode rc $?"
python - <<'PY' 2>&1 | tee $OUT/diag.txt
import os, json, time, hashlib
from pathlib import Path
from vgc.cache import kernel_hashes
from vgc import _compat
root = Path(os.environ["VGC_CACHE_ROOT"]); kernels = root / "inductor_cache"
for rank in kernel_hashes.rank_dirs(root):
    rec = kernel_hashes.read_record(rank) or {}
    print(rank.relative_to(root), len(rec))
    for name, value in sorted(rec.items()):
        p = kernels / name
        data = p.read_bytes() if p.is_file() else b""
        sha = hashlib.sha256(data).hexdigest()
        named = kernel_hashes.holds_its_name(name, data) if kernel_hashes.named_module(name) else "-"
        print(f"  {name} rec={value[:12]}{' FREE' if kernel_hashes.free_name(value) else ''} now={sha[:12]} "
              f"size={len(data)} names_its_code={named}")
t0 = time.perf_counter()
for path, why in kernel_hashes.mismatches(root, kernels, once=False):
    print("MISMATCH", path.relative_to(root), why[:90])
print(f"check {1000 * (time.perf_counter() - t0):.0f} ms")
names = sorted(str(p.relative_to(kernels)) for p in kernels.rglob("*") if p.is_file())
print(len(names), "files under inductor_cache;", [n for n in names if n.endswith(".py")][:20])
PY
