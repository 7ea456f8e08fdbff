# Issues 29 and 30 on the H200, third call: the warm-start A/B again (remembered torch and Triton keys), the
# decode traffic mix with the budget row in the profile's value order, and the gpu tests of this session's changes.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
mkdir -p /tmp/base && tar -xf benchmarks/device/base-vgc.tar -C /tmp/base
for tree in /tmp/base "$PWD"; do (cd "$tree" && PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx, torch._inductor.select_algorithm") ; done
timeout 200 python benchmarks/device/warm_ab.py /tmp/base "$PWD" 3 llama_1b cuda "$OUT/warm_ab.json" > "$OUT/warm_ab.log" 2>&1
echo "warm_ab rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-traffic timeout 240 python -m vgc bench decode --traffic generate --json "$OUT/decode_traffic.json" > "$OUT/decode_traffic.log" 2>&1
echo "decode_traffic rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 100 python -m pytest -q -m gpu tests/test_gpu.py tests/encoder/test_encoder_gpu.py -k "graph_memory or cudagraph_modes or encoder" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
# the remembered hashes on a machine with a GPU (Triton's is remembered there only)
PYTHONPATH=. timeout 120 python -m pytest -q tests/cache/test_source_hashes.py tests/cache/test_cache.py -k "source or triton or second_process" -p no:cacheprovider > "$OUT/cache_tests.log" 2>&1
echo "cache tests rc=$?" >> "$OUT/summary.txt"
