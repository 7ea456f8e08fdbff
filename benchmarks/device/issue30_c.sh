# Issue 30 on the H200, third call: the decode traffic mix again, with the budget row in the profile's value order,
# and the gpu tests of this session's changes.
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-traffic timeout 300 python -m vgc bench decode --traffic generate --json "$OUT/decode_traffic.json" > "$OUT/decode_traffic.log" 2>&1
echo "decode_traffic rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 150 python -m pytest -q -m gpu tests/test_gpu.py tests/encoder/test_encoder_gpu.py -k "graph_memory or cudagraph_modes or encoder" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
