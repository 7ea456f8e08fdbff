# Issue 31 on the H200, fourth call: gpu tests after the capture rewrite (one torch-function mode), start-up of the
# three strategies in one run (llama_1b, FULL_AND_PIECEWISE-equivalent graphs, every cache empty on the cold
# run), and the graph-broken user models against eager and torch.compile.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx" 2>/dev/null
PYTHONPATH=. timeout 120 python -m pytest -q -m gpu tests/test_gpu.py -k "breakable or eager_pieces" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
for strategy in breakable eager-pieces inductor; do
  PYTHONPATH=. timeout 150 python -m vgc bench startup --strategy $strategy --cudagraph-mode full_and_piecewise --warm-runs 1 --no-bundle --json "$OUT/startup_$strategy.json" > "$OUT/startup_$strategy.txt" 2>&1
  echo "startup $strategy rc=$?" >> "$OUT/summary.txt"
done
PYTHONPATH=. timeout 200 python benchmarks/device/graph_broken.py "$OUT" > "$OUT/graph_broken.txt" 2>&1
echo "graph broken rc=$?" >> "$OUT/summary.txt"
