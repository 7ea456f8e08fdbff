#!/usr/bin/env bash
# Issue 46 on the device: the integration's generate() before (old46/, the tree at 1fc11c0) and after the attention
# probe, interleaved A B A B in one run, and the gpu tests of the transformers integrations.
# Run from the repo root with old46/ holding `git archive 1fc11c0 vgc`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" | tee -a $OUT/gpu.txt
for round in 1 2; do
  for side in before after; do
    root=$([ $side = before ] && echo "$PWD/old46" || echo "$PWD")
    echo "== round $round $side" | tee -a $OUT/generate.txt
    (cd /tmp && PYTHONPATH=$root timeout 280 python -m vgc bench generate --model llama_1b --batch 1,8 \
       --only "vgc integration" --reps 3 --json $OUT/generate_${side}_${round}.json) 2>&1 | grep -v Warning | tail -12 | tee -a $OUT/generate.txt
  done
done
