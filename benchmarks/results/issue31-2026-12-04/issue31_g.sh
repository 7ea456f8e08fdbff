# Issue 31 on the H200 (2026-12-04, session 3): after the fix for transformers 5.17 (its mask preparation looked at
# generate()'s 2-D mask inside a segment, so no decode step replayed: call f): the gpu tests of breakable graphs,
# then `vgc bench generate` on llama_1b at batch 1 and 4 with the breakable row beside eager, the anchor and vgc's
# integration.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 150 python -m pytest -q -m gpu tests/test_gpu.py -k "breakable or eager_pieces" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-gen timeout 400 python -m vgc bench generate --model llama_1b --batch 1,4 \
  --only "eager,anchor,vgc integration,vgc breakable (dynamic cache)" --json "$OUT/generate.json" \
  > "$OUT/generate.txt" 2>&1
echo "generate rc=$?" >> "$OUT/summary.txt"
