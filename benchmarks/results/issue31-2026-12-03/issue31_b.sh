# Issue 31 on the H200, second call: where breakable capture time goes, then `vgc bench decode` with the new rows
# beside eager, reduce-overhead and vgc FULL / FULL_AND_PIECEWISE, all built first and timed interleaved.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 120 python benchmarks/device/breakable_profile.py "$OUT" > "$OUT/breakable_profile.log" 2>&1
echo "profile rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-decode timeout 420 python -m vgc bench decode --interleave --only "eager,inductor reduce-overhead,vgc FULL,vgc FULL_AND_PIECEWISE,vgc F&P eager pieces,breakable + whole decode,breakable" --json "$OUT/decode.json" > "$OUT/decode.log" 2>&1
echo "decode rc=$?" >> "$OUT/summary.txt"
