# Issue 31 on the H200 (2026-12-04, session 3), third call: the gpu tests of breakable graphs (the generate() one
# fixed: its reference shared the prepared model's config), the check of breakable generate() against SDPA and
# against vgc's attention run eagerly, with a profile of a llama_1b decode step, then `vgc bench generate` again
# (its decode-step timer now shows generate() the forward's signature, so the breakable row's steps replay).
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 120 python -m pytest -q -m gpu tests/test_gpu.py -k "breakable or eager_pieces" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 150 python benchmarks/device/breakable_generate_check.py "$OUT" > "$OUT/check.log" 2>&1
echo "check rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-gen timeout 300 python -m vgc bench generate --model llama_1b --batch 1,4 \
  --only "eager,anchor,vgc integration,vgc breakable (dynamic cache)" --json "$OUT/generate.json" \
  > "$OUT/generate.txt" 2>&1
echo "generate rc=$?" >> "$OUT/summary.txt"
