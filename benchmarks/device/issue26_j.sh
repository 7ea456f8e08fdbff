# Issue 26, 2026-12-05 call 1: the decode kernels as committed on 2026-12-04 (4 splits below 128 programs, the
# shared _new_kv helper) on CUDA: vgc's op tests, the GPU tests; the default row interleaved with reduce-overhead
# from empty caches; where the host time of a checked FULL replay goes.
export PYTHONPATH=.
timeout 170 python -m pytest -q -p no:cacheprovider tests/ops/ > $OUT/ops.log 2>&1; echo "ops tests rc=$? $(tail -1 $OUT/ops.log)" >> $OUT/summary.txt
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "not breakable and not tensor_parallel" > $OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(tail -1 $OUT/gpu.log)" >> $OUT/summary.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/ind
timeout 190 python -m vgc bench decode --interleave --only "vgc FULL_AND_PIECEWISE,inductor reduce-overhead" --json $OUT/decode.json > $OUT/decode.txt 2>&1
echo "decode rc=$?" >> $OUT/summary.txt
timeout 90 python benchmarks/device/host_path_profile.py > $OUT/host_profile.txt 2>&1; echo "host profile rc=$?" >> $OUT/summary.txt
cat $OUT/summary.txt; tail -30 $OUT/decode.txt; grep "until" $OUT/host_profile.txt
