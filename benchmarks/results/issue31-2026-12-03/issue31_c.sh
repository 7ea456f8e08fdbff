# Issue 31 on the H200, third call: gpu tests again, start-up of breakable graphs (capture made cheaper) and of eager
# pieces (their processes' logs kept: the warm start traced again in the first call), `vgc bench hf` on the
# transformers Llama with the new rows.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx" 2>/dev/null
PYTHONPATH=. timeout 120 python -m pytest -q -m gpu tests/test_gpu.py -k "breakable or eager_pieces" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
root=$(mktemp -d)
for run in cold warm; do
  PYTHONPATH=. VGC_CACHE_ROOT=$root/vgc TRITON_CACHE_DIR=$root/triton CUDA_CACHE_PATH=$root/cuda timeout 100 \
    python -m vgc.bench.startup --child llama_1b cuda full_and_piecewise eager-pieces $(date +%s.%N) > "$OUT/eager_pieces_$run.json" 2> "$OUT/eager_pieces_$run.err"
  echo "eager pieces $run rc=$?" >> "$OUT/summary.txt"
done
PYTHONPATH=. timeout 150 python -m vgc bench startup --strategy breakable --cudagraph-mode full_and_piecewise --warm-runs 1 --json "$OUT/startup_breakable.json" > "$OUT/startup_breakable.log" 2>&1
echo "startup breakable rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-hf timeout 240 python -m vgc bench hf --model llama --only "eager,inductor reduce-overhead,drop-in FULL_AND_PIECEWISE,drop-in F&P eager pieces,breakable" --json "$OUT/hf_llama.json" > "$OUT/hf_llama.log" 2>&1
echo "hf llama rc=$?" >> "$OUT/summary.txt"
