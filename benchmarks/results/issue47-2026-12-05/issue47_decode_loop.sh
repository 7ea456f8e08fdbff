#!/bin/bash
# Issue 47, the device loop: gpu tests of the loop and the integration; `vgc bench generate` with the anchor, the
# integration (device loop) and the integration with transformers' loop, at batch 1 and 8, in one run; then
# `vgc bench decode`'s default row with its kernels and launch gaps per step.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt"
timeout 240 python -m pytest -q -m gpu tests/integrations/test_decode_loop.py \
    tests/integrations/test_transformers_integration.py -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
echo "pytest rc $?" >> "$OUT/gpu_tests.txt"
timeout ${BENCH_TIMEOUT:-250} python -m vgc bench generate --batch 1,8 --reps 5 \
    --only "anchor,vgc integration,vgc integration (host loop)" --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
echo "bench rc $?" >> "$OUT/generate.txt"
timeout ${DECODE_TIMEOUT:-150} python -m vgc bench decode --only "vgc FULL_AND_PIECEWISE" \
    --json "$OUT/decode.json" > "$OUT/decode.txt" 2>&1
echo "decode rc $?" >> "$OUT/decode.txt"
grep -v "^DEBUG" "$OUT/gpu_tests.txt" | grep -A12 "^E \|passed\|failed" | tail -40
grep -v "^DEBUG" "$OUT/generate.txt" | grep -A5 "^row"; grep -v "^DEBUG" "$OUT/decode.txt" | tail -25
