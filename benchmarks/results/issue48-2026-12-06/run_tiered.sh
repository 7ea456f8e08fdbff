# Tiered start against the plain cold start, llama_1b, cudagraph none, each bench with its own empty caches;
# PYTHONPYCACHEPREFIX was meant to cache bytecode after the first process: no effect, the image sets
# PYTHONDONTWRITEBYTECODE (the bench says so). Then the gpu-marked tests of the tree.
set -u
cd benchmarks/results/issue48-2026-12-06/tree   # a copy of vgc/, tests/ and pyproject.toml as at commit 29097ac (gpu test at 2e-5), removed after
export PYTHONPATH=. PYTHONPYCACHEPREFIX=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a $OUT/card.txt
python -m vgc.shells.cli bench startup --warm-runs 1 --no-bundle 2>&1 | tail -6 | tee $OUT/plain1.txt
python -m vgc.shells.cli bench startup --strategy tiered --warm-runs 1 --no-bundle 2>&1 | tail -6 | tee $OUT/tiered1.txt
python -m vgc.shells.cli bench startup --warm-runs 0 --no-bundle 2>&1 | tail -4 | tee $OUT/plain2.txt
python -m vgc.shells.cli bench startup --strategy tiered --warm-runs 0 --no-bundle 2>&1 | tail -5 | tee $OUT/tiered2.txt
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_trace_once.py tests/cache tests/capture tests/test_tiered.py 2>&1 | tail -5 | tee $OUT/gpu_tests.txt
