# Issue 26, 2026-12-04 call 1: the decode kernel's variants and the fresh-prefill flash path, microbenchmarked
# (benchmarks/sweep_decode_attention.py); then the GPU tests of both, and those not yet run on the H200.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt 2>&1
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/ind
timeout 300 python benchmarks/sweep_decode_attention.py --rounds 5 > $OUT/sweep.txt 2>&1; echo "sweep rc=$?" >> $OUT/summary.txt
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "flash or decode_kernel_variant or sdpa_off_cudnn or attention_op_on_cuda or dynamic_cache or cudagraph_modes_equal_eager" > $OUT/gpu.log 2>&1
echo "gpu tests rc=$?" >> $OUT/summary.txt
tail -3 $OUT/gpu.log >> $OUT/summary.txt
cat $OUT/summary.txt; cat $OUT/sweep.txt
