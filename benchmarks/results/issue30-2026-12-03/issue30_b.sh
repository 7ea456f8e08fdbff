# Issue 30 on the H200, last call: the encoder's profile-chosen budgets against the auto levels (chat and heavy
# scenarios, vgc's ViT at Qwen2-VL's vision shape).
PYTHONPATH=. VGC_CACHE_ROOT=/tmp/vgc-enc timeout 440 python -m vgc bench encoder --scenarios a,b --only vgc-graphs,vgc-graphs-profile --requests 150 --json "$OUT/encoder_profile.json" > "$OUT/encoder_profile.log" 2>&1
echo "encoder_profile rc=$?" >> "$OUT/summary.txt"
