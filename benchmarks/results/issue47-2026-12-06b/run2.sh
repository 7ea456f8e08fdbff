#!/usr/bin/env bash
# Issue 47, session of 2026-12-06 (b), run 2: the fused one-row launches (skinny_matmul_fusion): their gpu tests, a
# sweep of their tiles with the decode chain, then the decode step (default / + fused / + fused + Inductor PDL,
# interleaved, the sweep's fused tiles in place) and generate() through the integration with and without fusion.
set -uo pipefail
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 120 python -m pytest -q -m "not extended" tests/ops/test_decode_step.py tests/passes/test_skinny_fusion.py -p no:cacheprovider -rA > $OUT/gpu_tests.txt 2>&1
echo "pytest rc $?" >> $OUT/gpu_tests.txt; grep -E "PASSED|FAILED|ERROR|passed|failed|rc " $OUT/gpu_tests.txt | tail -14
timeout 120 python benchmarks/sweep_skinny_mm.py --rows none --fused --json $OUT/sweep.json > $OUT/sweep.txt 2>&1
echo "sweep rc $?" >> $OUT/sweep.txt; grep -v "OutOfResources\|^  fused" $OUT/sweep.txt | tail -16
timeout 200 python - <<'PY' > $OUT/decode.txt 2>&1
import json, os, sys
from vgc.ops import triton_skinny_mm as t
try:
    for key, tile in json.load(open(os.environ["OUT"] + "/sweep.json"))["fused_tiles"]:
        t.FUSED_TILES[tuple(key)] = t.Tile(**tile)
except Exception as e:
    print("no sweep tiles:", e)
print("fused tiles:", t.FUSED_TILES, flush=True)
from vgc.bench import decode
sys.exit(decode.main(["--interleave", "--batches", "1,8,64", "--json", os.environ["OUT"] + "/decode.json", "--only",
    "vgc FULL_AND_PIECEWISE,vgc F&P + fused matmuls,vgc F&P + fused + Inductor PDL"]))
PY
echo "decode rc $?" >> $OUT/decode.txt; grep -v "^  \|Warning\|warn" $OUT/decode.txt | tail -24
timeout 140 python - <<'PY' > $OUT/generate.txt 2>&1
import json, os, sys
from vgc.ops import triton_skinny_mm as t
try:
    for key, tile in json.load(open(os.environ["OUT"] + "/sweep.json"))["fused_tiles"]:
        t.FUSED_TILES[tuple(key)] = t.Tile(**tile)
except Exception as e:
    print("no sweep tiles:", e)
from vgc.bench import generate
sys.exit(generate.main(["--batch", "1", "--reps", "3", "--json", os.environ["OUT"] + "/generate.json", "--only",
    "anchor,vgc integration,vgc integration + fused matmuls"]))
PY
echo "generate rc $?" >> $OUT/generate.txt; tail -12 $OUT/generate.txt
