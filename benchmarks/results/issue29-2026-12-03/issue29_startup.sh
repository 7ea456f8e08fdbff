# Issue 29 on the H200: `vgc bench startup` with the bundle row (the warm root packed, unpacked under a new root, a
# fresh process there with Triton's and CUDA's caches empty), llama_1b, no capture.
PYTHONPATH=. timeout 400 python -m vgc bench startup --warm-runs 2 --json "$OUT/startup.json" > "$OUT/startup.log" 2>&1
echo "startup rc=$?" >> "$OUT/summary.txt"
