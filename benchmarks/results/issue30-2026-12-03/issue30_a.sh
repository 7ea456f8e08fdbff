# Issues 29 and 30 on the H200, first call: the warm-start A/B (issue 29), the decode traffic mix (issue 30), the
# gpu tests of graph memory.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
python -c "import torch; from torch._inductor.codecache import torch_key; print(torch.__version__, type(torch_key).__name__, hasattr(torch_key, 'set'))" > "$OUT/torch_key_api.txt" 2>&1
mkdir -p /tmp/base && tar -xf benchmarks/device/base-vgc.tar -C /tmp/base
for tree in /tmp/base "$PWD"; do (cd "$tree" && PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx, torch._inductor.select_algorithm") ; done
timeout 240 python benchmarks/device/warm_ab.py /tmp/base "$PWD" 3 llama_1b cuda "$OUT/warm_ab.json" > "$OUT/warm_ab.log" 2>&1
echo "warm_ab rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-traffic timeout 240 python -m vgc bench decode --traffic generate --json "$OUT/decode_traffic.json" > "$OUT/decode_traffic.log" 2>&1
echo "decode_traffic rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 90 python -m pytest -q -m gpu tests/test_gpu.py -k "graph_memory or cudagraph_modes" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
