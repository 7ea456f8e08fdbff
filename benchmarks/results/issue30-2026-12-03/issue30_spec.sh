# Issue 30, speculative-decoding shapes: real FULL graphs of 4 tokens per sequence on the H200.
PYTHONPATH=. timeout 150 python -m pytest -q -m gpu tests/test_gpu.py -k "speculative or cudagraph_modes" -p no:cacheprovider > "$OUT/gpu_spec.log" 2>&1
echo "gpu spec rc=$?" >> "$OUT/summary.txt"
