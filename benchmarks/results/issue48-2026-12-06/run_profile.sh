# Warm-start profile of vgc.compile, llama_1b, cudagraph none. Every cache starts empty under $W.
set -u
W=$(mktemp -d); R=benchmarks/results/issue48-2026-12-06
export PYTHONPATH=. VGC_CACHE_ROOT=$W/vgc TRITON_CACHE_DIR=$W/triton TORCHINDUCTOR_CACHE_DIR=$W/vgc/inductor_cache CUDA_CACHE_PATH=$W/cuda
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a $OUT/card.txt
find / -name "__init__.cpython-*.pyc" -path "*torch/__pycache__*" 2>/dev/null | head -2 | tee -a $OUT/card.txt
for m in cold warm warm warm-preimported warm-preimported; do SPAWNED=$(date +%s.%N) python $R/warm_profile.py $m 2>&1 | tail -1 | tee -a $OUT/runs.txt; done
SPAWNED=$(date +%s.%N) python $R/warm_profile.py warm $OUT/warm_prof.txt 2>&1 | tail -1 | tee -a $OUT/runs.txt
SPAWNED=$(date +%s.%N) python $R/warm_profile.py warm-preimported $OUT/warm_pre_prof.txt 2>&1 | tail -1 | tee -a $OUT/runs.txt
python -X importtime $R/warm_profile.py warm 2> $OUT/importtime.txt | tail -1 | tee -a $OUT/runs.txt
sort -t'|' -k2 -n $OUT/importtime.txt | tail -60 > $OUT/importtime_top.txt
