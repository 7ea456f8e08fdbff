# Issue 26, 2026-12-04 call 2: GPU tests of the new attention paths (the sliding-window Mistral in its own process:
# a fault there poisons the CUDA context of every later test), then the default FULL_AND_PIECEWISE decode row
# before this session (f0b6f00, .trees/before) and after, each side in processes of its own: round 1 from empty
# caches, rounds 2-3 warm, the order alternating.
export PYTHONPATH=.
timeout 150 python -m pytest -q -p no:cacheprovider tests/ops/test_ops.py tests/ops/test_decode_step.py \
  tests/ops/test_causal_attention.py > $OUT/ops.log 2>&1; echo "ops tests rc=$? $(tail -1 $OUT/ops.log)" >> $OUT/summary.txt
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "flash or sdpa_off_cudnn or attention_op_on_cuda or cudagraph_modes_equal_eager or (dynamic_cache and llama)" > $OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(tail -1 $OUT/gpu.log)" >> $OUT/summary.txt
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "dynamic_cache and mistral" > $OUT/gpu-mistral.log 2>&1
echo "gpu mistral rc=$? $(tail -1 $OUT/gpu-mistral.log)" >> $OUT/summary.txt
C=$(mktemp -d)
orders=("before after" "after before" "before after")
for round in 1 2 3; do
  for side in ${orders[$((round - 1))]}; do
    dir=.trees/$side; [ "$side" = after ] && dir=.
    ( cd "$dir" && PYTHONPATH=. VGC_CACHE_ROOT=$C/vgc-$side TORCHINDUCTOR_CACHE_DIR=$C/inductor-$side \
        TRITON_CACHE_DIR=$C/triton-$side CUDA_CACHE_PATH=$C/cuda-$side timeout 120 python -m vgc bench decode \
        --only "vgc FULL_AND_PIECEWISE" --no-kernel-count --json "$C/$side-$round.json" ) > "$C/$side-$round.log" 2>&1
    echo "$side round $round rc=$? $(grep '^vgc FULL_AND_PIECEWISE' "$C/$side-$round.log" | head -1)" >> "$OUT/summary.txt"
  done
done
tar czf "$OUT/results.tgz" -C "$C" $(cd "$C" && ls *.json *.log)
cat $OUT/summary.txt
