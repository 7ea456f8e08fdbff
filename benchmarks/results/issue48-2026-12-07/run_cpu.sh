#!/usr/bin/env bash
# Issue 48, second session of 2026-12-07, on the 2-core CPU machine (torch 2.13.0+cpu): warm starts of the tiny
# decoder (warm_profile.py of 2026-12-06 d, cudagraph_mode none), the tree before the remembered precompiled header
# (BASE: `git archive <its parent> vgc | tar -x -C $BASE`) and after it, fresh processes interleaved; one cold start
# of each first (their cache entries differ: vgc's source is in the key). Output: cpu_headers.txt.
set -uo pipefail
BASE=${BASE:-/tmp/base48}; NEW=${NEW:-$PWD}
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TORCHINDUCTOR_CACHE_DIR=$C/ind TRITON_CACHE_DIR=$C/tr
D=benchmarks/results/issue48-2026-12-06d
for side in $BASE $NEW; do PYTHONPATH=$side SPAWNED=$(date +%s.%N) python -P $D/warm_profile.py cold 2>&1 | tail -1 | cut -c1-120; done
for i in 1 2 3 4; do for side in $BASE $NEW; do
  echo -n "$side "; PYTHONPATH=$side SPAWNED=$(date +%s.%N) python -P $D/warm_profile.py warm 2>&1 | tail -1 | grep -o "warmup [0-9.]* first.*'warmup'"
done; done
