# Issue 31 on the H200, for the session after 2026-12-04 (built without device time): breakable graphs under
# transformers generate() on the default DynamicCache. The gpu tests (the new one: generate() on the dynamic
# cache), then `vgc bench generate` on llama_1b at batch 1 and 4 with the new row beside eager, the anchor and
# vgc's integration.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 240 python -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-gen timeout 330 python -m vgc bench generate --model llama_1b --batch 1,4 \
  --only "eager,anchor,vgc integration,vgc breakable (dynamic cache)" --json "$OUT/generate.json" \
  > "$OUT/generate.txt" 2>&1
echo "generate rc=$?" >> "$OUT/summary.txt"
