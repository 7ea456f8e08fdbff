#!/bin/bash
# Issue 47, the device loop: gpu tests of the loop and the integration, then `vgc bench generate` with the anchor,
# the integration (device loop) and the integration with transformers' loop, at batch 1 and 8, in one run.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt"
timeout 240 python -m pytest -q -m gpu tests/integrations/test_decode_loop.py \
    tests/integrations/test_transformers_integration.py -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
echo "pytest rc $?" >> "$OUT/gpu_tests.txt"
timeout ${BENCH_TIMEOUT:-330} python -m vgc bench generate --batch 1,8 --reps 5 \
    --only "anchor,vgc integration,vgc integration (host loop)" --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
echo "bench rc $?" >> "$OUT/generate.txt"
tail -30 "$OUT/gpu_tests.txt"; grep -v "^DEBUG" "$OUT/generate.txt" | tail -25
