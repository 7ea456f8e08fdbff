#!/usr/bin/env bash
# Issue 48, second session of 2026-12-07, on the 2-core CPU machine (torch 2.13.0+cpu): warm starts of the tiny
# decoder (warm_profile.py of 2026-12-06 d, cudagraph_mode none), fresh processes of each tree in TREES interleaved
# (each made by `git archive <commit> vgc | tar -x -C <dir>`); one cold start of each first (their cache entries
# differ: vgc's source is in the key). cpu_headers.txt: the tree before the remembered precompiled header against
# after it, while another test run loaded the machine; cpu_idle.txt: f07725e (before), b5f33c5 (the header
# remembered) and 0875252 (the shape guards unpickled as saved), the machine otherwise idle.
set -uo pipefail
TREES=${TREES:-/tmp/base48 $PWD}
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TORCHINDUCTOR_CACHE_DIR=$C/ind TRITON_CACHE_DIR=$C/tr
D=benchmarks/results/issue48-2026-12-06d
for side in $TREES; do PYTHONPATH=$side SPAWNED=$(date +%s.%N) python -P $D/warm_profile.py cold 2>&1 | tail -1 | cut -c1-120; done
for i in 1 2 3 4; do for side in $TREES; do
  echo -n "$side "; PYTHONPATH=$side SPAWNED=$(date +%s.%N) python -P $D/warm_profile.py warm 2>&1 | tail -1 | grep -o "warmup [0-9.]* first.*'warmup'"
done; done
