# Issue 28 on the H200, second call (after the one-copy buffers and the reference ViT's positions buffer): the
# encoder GPU tests again; `vgc bench encoder --model hf-qwen2-vl`, chat (a), heavy (b) and mixed video (e), rows
# eager, vgc-nograph and vgc-graphs; then torch.compile of the tower's own forward on the chat scenario alone
# (its recompiles per request layout are slow), each bench from empty caches.
C=$(mktemp -d)
export TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton
VGC_CACHE_ROOT=$C/vgc-tests PYTHONPATH=. timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/encoder/test_encoder_gpu.py > "$OUT/gpu-encoder.log" 2>&1
echo "gpu encoder tests rc=$? $(tail -1 "$OUT/gpu-encoder.log")" >> "$OUT/summary.txt"
rm -rf "$C/inductor" "$C/triton"
VGC_CACHE_ROOT=$C/vgc PYTHONPATH=. timeout 230 python -m vgc bench encoder --model hf-qwen2-vl --scenarios a,b,e \
    --only eager,vgc-nograph,vgc-graphs --requests 200 --requests-small 60 --json "$OUT/hf-qwen2-vl.json" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/summary.txt"
rm -rf "$C/inductor" "$C/triton"
VGC_CACHE_ROOT=$C/vgc-c PYTHONPATH=. timeout 150 python -m vgc bench encoder --model hf-qwen2-vl --scenarios a \
    --only eager,compile-default --requests 60 --json "$OUT/hf-qwen2-vl-compile.json" > "$OUT/bench-compile.log" 2>&1
echo "bench compile rc=$?" >> "$OUT/summary.txt"
