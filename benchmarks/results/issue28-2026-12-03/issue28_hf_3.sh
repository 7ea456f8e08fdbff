# Issue 28 on the H200, third call: `vgc bench encoder --model hf-qwen2-vl` with the default slots (one per
# min_budget tokens), chat (a), heavy (b) and mixed video (e), rows eager and vgc-graphs, every cache empty.
C=$(mktemp -d)
export VGC_CACHE_ROOT=$C/vgc TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton
PYTHONPATH=. timeout 300 python -m vgc bench encoder --model hf-qwen2-vl --scenarios a,b,e --only eager,vgc-graphs \
    --requests 200 --requests-small 60 --json "$OUT/hf-qwen2-vl-3.json" > "$OUT/bench-3.log" 2>&1
echo "bench rc=$?" >> "$OUT/summary.txt"
