#!/usr/bin/env bash
# Issue 49, session of 2026-12-06 (c): `run_ab.sh decode|generate`: before (4be279c, copied under before/) and after
# the CUDA-graph owners were rebuilt on one core, interleaved by process: before, after, before, after.
# decode: a row per owner that replays graphs: vgc.compile's FULL dispatch (decode) and piece graphs (its prefill
# column), drop-in, breakable; generate: the integration's decode graph + sampler graph. One Inductor cache for
# all processes (the pieces' code is the same on both sides): only the first process compiles cold; the timings
# do not depend on it.
set -uo pipefail
HERE=$(pwd)
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
for round in 1 2; do
  for side in before after; do
    dir=$HERE; [ $side = before ] && dir=$HERE/benchmarks/results/issue49-2026-12-06/before
    start=$(date +%s)
    if [ "$1" = decode ]; then
      (cd $dir && PYTHONPATH=. timeout 140 python -m vgc bench decode --interleave --batches 1,8,64 --steps 100 \
          --only "vgc FULL_AND_PIECEWISE,drop-in FULL_AND_PIECEWISE,breakable + whole decode" --no-kernel-count \
          --json $OUT/decode_${side}_${round}.json) > $OUT/decode_${side}_${round}.txt 2>&1
      echo "decode $side $round rc $? $(( $(date +%s) - start )) s"; grep -E "^(vgc|drop|break)" $OUT/decode_${side}_${round}.txt | head -6
    else
      (cd $dir && PYTHONPATH=. timeout 140 python -m vgc bench generate --batch 1,8 --reps 3 --only "vgc integration" \
          --json $OUT/generate_${side}_${round}.json) > $OUT/generate_${side}_${round}.txt 2>&1
      echo "generate $side $round rc $? $(( $(date +%s) - start )) s"; tail -5 $OUT/generate_${side}_${round}.txt
    fi
  done
done
