# Issue 26, device call 2: the default FULL_AND_PIECEWISE against its twins interleaved from empty caches, a warm
# start on the same caches, a kernel profile of the default decode step, and the gpu-marked tests.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt 2>&1
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda; unset TORCHINDUCTOR_CACHE_DIR
timeout 240 python -m vgc bench decode --interleave --only "vgc FULL_AND_PIECEWISE,vgc F&P lengths per layer,inductor reduce-overhead,vgc F&P tuned [1]" --json $OUT/decode.json > $OUT/decode.txt 2>&1
timeout 60 python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --batches 1,8 --no-kernel-count > $OUT/warm.txt 2>&1
timeout 70 python benchmarks/device/issue26_profile.py > $OUT/profile.txt 2>&1
timeout 120 python -m pytest -q -m gpu tests/test_decode_step.py tests/test_gpu.py -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1
tail -3 $OUT/gpu_tests.txt
