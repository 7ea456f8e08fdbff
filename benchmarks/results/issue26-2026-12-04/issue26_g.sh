# Issue 26, 2026-12-04 call 3: the default row against reduce-overhead in one interleaved run (kernel counts after
# all timing), where the default step's time goes now (issue26_profile.py), and vgc's transformers integration
# (which decodes with vgc::attention) under generate() before this session (.trees/before) and after.
export PYTHONPATH=.
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/ind
timeout 200 python -m vgc bench decode --interleave --only "vgc FULL_AND_PIECEWISE,inductor reduce-overhead" \
  --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?" >> $OUT/summary.txt
timeout 100 python benchmarks/device/issue26_profile.py > $OUT/profile.txt 2>&1; echo "profile rc=$?" >> $OUT/summary.txt
for side in before after; do
  dir=.trees/$side; [ "$side" = after ] && dir=.
  ( cd "$dir" && PYTHONPATH=. VGC_CACHE_ROOT=$C/gen-$side TORCHINDUCTOR_CACHE_DIR=$C/gen-ind-$side \
      TRITON_CACHE_DIR=$C/gen-triton-$side timeout 130 python -m vgc bench generate --model llama_1b --batch 1,4 \
      --only "vgc integration" --json $OUT/generate-$side.json ) > $OUT/generate-$side.txt 2>&1
  echo "generate $side rc=$?" >> $OUT/summary.txt
done
cat $OUT/summary.txt; grep -A12 "^strategy" $OUT/decode.txt; grep -B2 -A6 "^row\|^strategy" $OUT/generate-*.txt | head -40
