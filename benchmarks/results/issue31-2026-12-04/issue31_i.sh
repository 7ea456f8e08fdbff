# Issue 31 on the H200 (2026-12-04, session 3), fourth call: does SDPA's cuDNN attention cost milliseconds of host
# time per new KV length (call 3's profile: 1.95 ms of CPU per decode attention)? The microbenchmark, then
# breakable generate() with fresh prompt lengths with and without cuDNN, the gpu tests touching the op, and
# `vgc bench generate` with the op now keeping SDPA off cuDNN.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 120 python benchmarks/device/sdpa_decode_backends.py "$OUT" > "$OUT/sdpa_decode_backends.txt" 2>&1
echo "sdpa backends rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 150 python benchmarks/device/breakable_fresh_lengths.py "$OUT" > "$OUT/breakable_fresh_lengths.txt" 2>&1
echo "fresh lengths rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 100 python -m pytest -q -m gpu tests/test_gpu.py -k "breakable or causal or attention" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-gen timeout 220 python -m vgc bench generate --model llama_1b --batch 1,4 \
  --only "eager,anchor,vgc breakable (dynamic cache)" --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
echo "generate rc=$?" >> "$OUT/summary.txt"
