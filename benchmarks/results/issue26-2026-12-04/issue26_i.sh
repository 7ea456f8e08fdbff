# Issue 26, 2026-12-04 call 5: the decode kernel with its context split over programs at small batch (merged by
# a second launch): vgc's op tests on CUDA (every variant against the reference), the sweep with the split
# variants, the GPU tests that run vgc::attention, then the default decode row from empty caches.
export PYTHONPATH=.
timeout 100 python -m pytest -q -p no:cacheprovider tests/ops/ > $OUT/ops.log 2>&1; echo "ops tests rc=$? $(tail -1 $OUT/ops.log)" >> $OUT/summary.txt
timeout 100 python benchmarks/sweep_decode_attention.py --rounds 3 > $OUT/sweep.txt 2>&1; echo "sweep rc=$?" >> $OUT/summary.txt
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "not breakable and not tensor_parallel" > $OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(tail -1 $OUT/gpu.log)" >> $OUT/summary.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/ind
timeout 90 python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" --no-kernel-count --json $OUT/decode.json > $OUT/decode.txt 2>&1
echo "decode rc=$? $(grep '^vgc FULL_AND_PIECEWISE' $OUT/decode.txt | head -1)" >> $OUT/summary.txt
cat $OUT/summary.txt $OUT/sweep.txt
