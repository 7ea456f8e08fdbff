# Issue 31 on the H200 (2026-12-04, session 3), sixth call: every vgc attention op off cuDNN (vgc.ops.sdpa). Fresh
# prompt lengths under generate() for breakable graphs and vgc's Inductor integration, with and without cuDNN; then
# start-up of llama_1b, breakable graphs and vgc.compile (Inductor pieces), FULL_AND_PIECEWISE, cold, in one call.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 150 python benchmarks/device/fresh_lengths.py "$OUT" > "$OUT/fresh_lengths.txt" 2>&1
echo "fresh lengths rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx" 2>/dev/null
for strategy in breakable inductor; do
  PYTHONPATH=. timeout 100 python -m vgc bench startup --strategy $strategy --cudagraph-mode full_and_piecewise --warm-runs 0 --no-bundle --json "$OUT/startup_$strategy.json" > "$OUT/startup_$strategy.txt" 2>&1
  echo "startup $strategy rc=$?" >> "$OUT/summary.txt"
done
