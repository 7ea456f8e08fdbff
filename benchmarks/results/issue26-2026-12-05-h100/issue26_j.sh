# 2026-12-05 call 1 (issues 26 and 29): the decode kernels as committed on 2026-12-04 (4 splits below 128 programs,
# the shared _new_kv helper) on CUDA: vgc's op tests, the GPU tests; the default decode row interleaved with
# reduce-overhead from empty caches; `vgc bench startup` with bytecode caching (the cold process writes it).
export PYTHONPATH=. PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
timeout 150 python -m pytest -q -p no:cacheprovider tests/ops/ > $OUT/ops.log 2>&1; echo "ops tests rc=$? $(tail -1 $OUT/ops.log)" >> $OUT/summary.txt
timeout 110 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "not breakable and not tensor_parallel" > $OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(tail -1 $OUT/gpu.log)" >> $OUT/summary.txt
C=$(mktemp -d)
VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/ind \
  timeout 190 python -m vgc bench decode --interleave --only "vgc FULL_AND_PIECEWISE,inductor reduce-overhead" \
  --json $OUT/decode.json > $OUT/decode.txt 2>&1
echo "decode rc=$?" >> $OUT/summary.txt
timeout 130 python -m vgc bench startup --warm-runs 2 --json $OUT/startup.json > $OUT/startup.log 2>&1
echo "startup rc=$?" >> $OUT/summary.txt
cat $OUT/summary.txt; tail -25 $OUT/decode.txt; tail -12 $OUT/startup.log
