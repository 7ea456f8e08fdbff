#!/usr/bin/env bash
# Issue 47 item 1, run 1: vgc's one-row GEMV kernel against cuBLAS on Llama-1B's shapes, the chained decode
# products with and without PDL, then the decode step with the kernels in place (tiles from the sweep), then the
# gpu tests of the kernels and of the decode loop.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 200 python benchmarks/sweep_skinny_mm.py --rows 1,2,8 --json $OUT/sweep.json 2>&1 | tee $OUT/sweep.txt
timeout 290 python - <<'PY' 2>&1 | tee $OUT/decode.txt
import json, os, sys
from vgc.ops import triton_skinny_mm as t
for n, k, tile in json.load(open(os.environ["OUT"] + "/sweep.json"))["gemv_tiles"]:
    t._GEMV_TILES[(n, k)] = t.Tile(**tile)
print("tiles:", t._GEMV_TILES, flush=True)
from vgc.bench import decode
sys.exit(decode.main(["--interleave", "--batches", "1,8", "--json", os.environ["OUT"] + "/decode.json", "--only",
    "vgc FULL_AND_PIECEWISE,vgc F&P + skinny mm,vgc F&P + PDL,vgc F&P + skinny mm + PDL"]))
PY
timeout 90 python -m pytest -q -m gpu tests/ops/test_decode_step.py tests/integrations/test_decode_loop.py \
    -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; echo "pytest rc $?" >> $OUT/gpu_tests.txt
tail -5 $OUT/gpu_tests.txt
