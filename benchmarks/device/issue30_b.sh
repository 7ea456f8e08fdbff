# Issue 30 on the H200, second call: the encoder's profile-chosen budgets against the auto levels (chat and heavy
# scenarios, vgc's ViT at Qwen2-VL's vision shape), and the encoder gpu tests.
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-enc timeout 480 python -m vgc bench encoder --scenarios a,b --only vgc-graphs,vgc-graphs-profile --requests 200 --json "$OUT/encoder_profile.json" > "$OUT/encoder_profile.log" 2>&1
echo "encoder_profile rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 100 python -m pytest -q -m gpu tests/encoder/test_encoder_gpu.py -p no:cacheprovider > "$OUT/encoder_gpu_tests.log" 2>&1
echo "encoder gpu tests rc=$?" >> "$OUT/summary.txt"
