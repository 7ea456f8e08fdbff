# Issue 26, device call 4: the scoped tuning row alone from empty caches (its cold setup), then warm on them.
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda; unset TORCHINDUCTOR_CACHE_DIR
timeout 200 python -m vgc bench decode --only "vgc F&P tuned [1]" --batches 1,8 --no-kernel-count > $OUT/cold.txt 2>&1
timeout 90 python -m vgc bench decode --only "vgc F&P tuned [1]" --batches 1,8 --no-kernel-count > $OUT/warm.txt 2>&1
grep -A2 "^strategy" $OUT/cold.txt $OUT/warm.txt
