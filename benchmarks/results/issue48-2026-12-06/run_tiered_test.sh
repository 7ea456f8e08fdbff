# The gpu-marked tiered test alone, with its whole output (run_tiered.sh kept only the summary).
cd benchmarks/results/issue48-2026-12-06/tree
PYTHONPATH=. timeout 300 python -m pytest -x -p no:cacheprovider -m gpu tests/test_tiered.py -o log_cli=false 2>&1 | grep -v "torch.__trace" > $OUT/gpu_tiered_full.txt
tail -150 $OUT/gpu_tiered_full.txt
