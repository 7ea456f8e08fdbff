# Issue 31 on the H200, first call: the gpu tests of eager pieces and breakable graphs, then start-up of llama_1b
# three ways (vgc.compile with Inductor pieces, with eager pieces, breakable graphs), each cold in fresh processes
# with every cache empty, FULL_AND_PIECEWISE-equivalent graphs.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx" 2>/dev/null   # bytecode, as an installed torch has it
PYTHONPATH=. timeout 150 python -m pytest -q -m gpu tests/test_gpu.py -k "breakable or eager_pieces or cudagraph_modes" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
for strategy in breakable eager-pieces inductor; do
  PYTHONPATH=. timeout 200 python -m vgc bench startup --strategy $strategy --cudagraph-mode full_and_piecewise --warm-runs 1 --no-bundle --json "$OUT/startup_$strategy.json" > "$OUT/startup_$strategy.log" 2>&1
  echo "startup $strategy rc=$?" >> "$OUT/summary.txt"
done
