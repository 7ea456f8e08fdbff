# Issue 26, device call 1: the skinny-mm tile sweep, then FULL_AND_PIECEWISE and its twins interleaved from empty
# caches, then a warm start of the default row on the same caches.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt 2>&1
python -c "import torch, triton; print(torch.__version__, triton.__version__)" > $OUT/versions.txt 2>&1
timeout 190 python benchmarks/sweep_skinny_mm.py --json $OUT/sweep.json > $OUT/sweep.txt 2>&1
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda; unset TORCHINDUCTOR_CACHE_DIR
timeout 300 python -m vgc bench decode --interleave --only "vgc FULL_AND_PIECEWISE,vgc F&P no skinny mm,vgc F&P + PDL,inductor reduce-overhead,vgc F&P tuned [1]" --json $OUT/decode.json > $OUT/decode.txt 2>&1
timeout 70 python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --batches 1,8 --no-kernel-count > $OUT/warm.txt 2>&1
tail -5 $OUT/sweep.txt $OUT/decode.txt $OUT/warm.txt
