# Issue 31 on the H200 (2026-12-04, session 3), fifth call: vgc::causal_attention off cuDNN, its decode mask the
# additive bias made once per step. The op's host time per call three ways (fresh and repeated KV lengths),
# breakable generate() with fresh prompt lengths with and without cuDNN, every gpu test, `vgc bench generate`.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 100 python benchmarks/device/sdpa_decode_backends.py "$OUT" > "$OUT/sdpa_decode_backends.txt" 2>&1
echo "op backends rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 120 python benchmarks/device/breakable_fresh_lengths.py "$OUT" > "$OUT/breakable_fresh_lengths.txt" 2>&1
echo "fresh lengths rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 150 python -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-gen timeout 180 python -m vgc bench generate --model llama_1b --batch 1,4 \
  --only "eager,anchor,vgc breakable (dynamic cache)" --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
echo "generate rc=$?" >> "$OUT/summary.txt"
