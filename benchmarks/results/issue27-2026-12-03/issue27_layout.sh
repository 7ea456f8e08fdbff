# Issue 27 and the issue-26 host-path commit on the H200: the default FULL_AND_PIECEWISE decode row before the
# restructure (4957e98), after it (40381cf) and with the host-path commit (c4a9771, the working tree), each side in
# a process of its own, interleaved (before, layout, host) twice: round 1 from empty caches, round 2 warm.
# The two older trees come in .trees/ (git archive of each commit). Then the GPU tests of the working tree.
C=$(mktemp -d)
for round in 1 2; do
  for side in before layout host; do
    dir=.trees/$side; [ "$side" = host ] && dir=.
    ( cd "$dir" && PYTHONPATH=. VGC_CACHE_ROOT=$C/vgc-$side TORCHINDUCTOR_CACHE_DIR=$C/inductor-$side \
        TRITON_CACHE_DIR=$C/triton-$side timeout 170 python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" \
        --no-kernel-count --json "$OUT/$side-$round.json" ) > "$OUT/$side-$round.log" 2>&1
    echo "$side round $round rc=$?" >> "$OUT/status"
  done
done
PYTHONPATH=. timeout 220 python -m pytest -q -m gpu -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/status"
