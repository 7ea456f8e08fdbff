# Issue 31 on the H200 (2026-12-04, session 3), seventh call: start-up of llama_1b, breakable graphs and vgc.compile
# (Inductor pieces), FULL_AND_PIECEWISE-equivalent graphs, cold only, one after the other (call 6's run of this
# stopped on `--warm-runs 0`, which the bench now takes).
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx" 2>/dev/null
for strategy in breakable inductor; do
  PYTHONPATH=. timeout 90 python -m vgc bench startup --strategy $strategy --cudagraph-mode full_and_piecewise --warm-runs 0 --no-bundle --json "$OUT/startup_$strategy.json" > "$OUT/startup_$strategy.txt" 2>&1
  echo "startup $strategy rc=$?" >> "$OUT/summary.txt"
done
