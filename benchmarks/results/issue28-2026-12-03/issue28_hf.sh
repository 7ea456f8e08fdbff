# Issue 28 on the H200, first call: the encoder GPU tests (the reference ViT and both transformers Qwen towers
# through the shipped adapter, real graphs), then `vgc bench encoder --model hf-qwen2-vl` on the chat (a) and heavy
# (b) scenarios: the tower's own eager forward against vgc's budget graphs, every cache empty at the start.
C=$(mktemp -d)
export VGC_CACHE_ROOT=$C/vgc TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/summary.txt" 2>&1
PYTHONPATH=. timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/encoder/test_encoder_gpu.py > "$OUT/gpu-encoder.log" 2>&1
echo "gpu encoder tests rc=$? $(tail -1 "$OUT/gpu-encoder.log")" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 340 python -m vgc bench encoder --model hf-qwen2-vl --scenarios a,b --only eager,vgc-graphs \
    --requests 200 --json "$OUT/hf-qwen2-vl.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/summary.txt"
