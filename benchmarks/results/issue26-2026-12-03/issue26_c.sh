# Issue 26, device call 3: the default FULL_AND_PIECEWISE against its twins interleaved from empty caches (kernel
# counts after all timing), then a warm start of the default row on the same caches.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt 2>&1
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda; unset TORCHINDUCTOR_CACHE_DIR
timeout 300 python -m vgc bench decode --interleave --only "vgc FULL_AND_PIECEWISE,vgc F&P lengths per layer,inductor reduce-overhead,vgc F&P tuned [1],vgc F&P + skinny mm" --json $OUT/decode.json > $OUT/decode.txt 2>&1
timeout 70 python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --no-kernel-count --json $OUT/warm.json > $OUT/warm.txt 2>&1
grep -A8 "^strategy" $OUT/decode.txt $OUT/warm.txt
