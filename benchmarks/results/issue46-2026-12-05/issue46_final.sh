#!/usr/bin/env bash
# Issue 46, final code on the device: the gpu tests of the integrations and of vgc::attention (its new ALiBi
# argument beside the Triton kernels), then the integration's generate() before (old46/ = 1fc11c0) and after,
# A B A B. Run from the repo root with old46/ carried.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
PYTHONPATH=. timeout 300 python -m pytest -q -m gpu tests/integrations tests/ops -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
for round in 1 2; do
  for side in before after; do
    root=$([ $side = before ] && echo "$PWD/old46" || echo "$PWD")
    echo "== round $round $side" | tee -a $OUT/generate.txt
    (cd /tmp && PYTHONPATH=$root timeout 200 python -m vgc bench generate --model llama_1b --batch 1,8 \
       --only "vgc integration" --reps 3 --json $OUT/final_${side}_${round}.json) 2>&1 | grep -E "^vgc integration" | tee -a $OUT/generate.txt
  done
done
