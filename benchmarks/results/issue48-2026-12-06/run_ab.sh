# A/B of warm starts, llama_1b, cudagraph none: base = vgc at 350339c (before this session; made with
# `mkdir base && git archive 350339c vgc | tar -x -C base` in this folder, removed after the run), new = the tree.
# Each variant has its own empty caches. PYTHONPYCACHEPREFIX was meant to cache bytecode for every process, as for
# an installed torch: no effect, the image sets PYTHONDONTWRITEBYTECODE (every process compiled torch). Order: cold base, cold new, then warm base / warm new interleaved four times.
set -u
R=benchmarks/results/issue48-2026-12-06; W=$(mktemp -d)
export PYTHONPYCACHEPREFIX=$W/pyc
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
start() {   # variant mode
  local p=.; [ "$1" = base ] && p=$R/base
  env PYTHONPATH=$p VGC_CACHE_ROOT=$W/$1/vgc TORCHINDUCTOR_CACHE_DIR=$W/$1/vgc/inductor_cache \
      TRITON_CACHE_DIR=$W/$1/triton CUDA_CACHE_PATH=$W/$1/cuda SPAWNED=$(date +%s.%N) \
      python $R/warm_profile.py $2 2>&1 | tail -1 | sed "s/^/$1 /" | tee -a $OUT/ab.txt
}
start base cold; start new cold
for i in 1 2 3 4; do start base warm; start new warm; done
