# Issue 27 and the issue-26 host-path commits on the H200, second call: the default FULL_AND_PIECEWISE decode row
# before the restructure (4957e98), after it (40381cf) and with the host-path commits (the working tree), each in a
# process of its own; round 1 from empty caches, then three warm rounds, the order rotated every round. Then the
# one GPU test the first call's time limit cut off (one-rank NCCL).
C=$(mktemp -d)
orders=("before layout host" "host before layout" "layout host before" "before layout host")
for round in 1 2 3 4; do
  for side in ${orders[$((round - 1))]}; do
    dir=.trees/$side; [ "$side" = host ] && dir=.
    ( cd "$dir" && PYTHONPATH=. VGC_CACHE_ROOT=$C/vgc-$side TORCHINDUCTOR_CACHE_DIR=$C/inductor-$side \
        TRITON_CACHE_DIR=$C/triton-$side timeout 150 python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" \
        --no-kernel-count --json "$C/$side-$round.json" ) > "$C/$side-$round.log" 2>&1
    echo "$side round $round rc=$? $(grep '^vgc FULL_AND_PIECEWISE' "$C/$side-$round.log")" >> "$OUT/summary.txt"
  done
done
tar czf "$OUT/results.tgz" -C "$C" $(cd "$C" && ls *.json *.log)
PYTHONPATH=. timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_tensor_parallel.py > "$OUT/gpu-tp.log" 2>&1
echo "gpu tp tests rc=$?" >> "$OUT/summary.txt"
