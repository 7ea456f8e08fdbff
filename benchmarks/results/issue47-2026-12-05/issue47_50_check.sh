#!/bin/bash
# Issues 47 and 50, the session's last device call: the gpu tests of the decode loop and the integration (the
# host-wait count in its second form), and a drop-in benchmark row run from the checkout in
# place (vgc not installed: the backend is registered by the command, not by an entry point).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
timeout 200 python -m pytest -q -m gpu tests/integrations/test_decode_loop.py \
    tests/integrations/test_transformers_integration.py -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
echo "pytest rc $?" >> "$OUT/gpu_tests.txt"
timeout 120 python -m vgc bench decode --model tiny --only "drop-in FULL" --steps 5 --no-kernel-count \
    > "$OUT/dropin.txt" 2>&1
echo "bench rc $?" >> "$OUT/dropin.txt"
for f in gpu_tests dropin; do grep -v "^DEBUG" "$OUT/$f.txt" | grep -A3 "^E \|passed\|failed\|rc \|drop-in FULL " | tail -12; done
