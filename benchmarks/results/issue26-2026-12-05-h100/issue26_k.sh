# 2026-12-05 call 2 (issue 26, item 4): `vgc bench hf`'s default drop-in row (Llama and ViT) before issue 26
# (474e947, .trees/before) and after (this tree), each side in processes of its own: round 1 from empty caches,
# round 2 warm, the order alternating.
export PYTHONPYCACHEPREFIX=/tmp/pyc
C=$(mktemp -d)
orders=("before after" "after before")
for round in 1 2; do
  for side in ${orders[$((round - 1))]}; do
    dir=.trees/$side; [ "$side" = after ] && dir=.
    for model in llama vit; do
      ( cd "$dir" && PYTHONPATH=. VGC_CACHE_ROOT=$C/vgc-$side TORCHINDUCTOR_CACHE_DIR=$C/inductor-$side \
          TRITON_CACHE_DIR=$C/triton-$side CUDA_CACHE_PATH=$C/cuda-$side timeout 100 python -m vgc bench hf \
          --model $model --only "drop-in FULL_AND_PIECEWISE" --json "$OUT/$model-$side-$round.json" ) \
          > "$OUT/$model-$side-$round.log" 2>&1
      echo "$model $side round $round rc=$? $(grep '^drop-in FULL_AND_PIECEWISE' "$OUT/$model-$side-$round.log" | head -1)" >> "$OUT/summary.txt"
    done
  done
done
cat $OUT/summary.txt
