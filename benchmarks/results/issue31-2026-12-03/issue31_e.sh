# Issue 31 on the H200, last call: every gpu test of tests/test_gpu.py, and `vgc bench hf` on the transformers ViT
# with the new rows.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=. timeout 240 python -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-hf timeout 200 python -m vgc bench hf --model vit --only "eager,inductor reduce-overhead,drop-in FULL_AND_PIECEWISE,drop-in F&P eager pieces,breakable" --json "$OUT/hf_vit.json" > "$OUT/hf_vit.txt" 2>&1
echo "hf vit rc=$?" >> "$OUT/summary.txt"
