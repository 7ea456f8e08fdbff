# A smoke run of the decode benches after a refactor (tiny model: seconds, not numbers).
PYTHONPATH=. timeout 150 python -m vgc bench decode --model tiny --only "vgc FULL_AND_PIECEWISE" --steps 5 --batches 1,8 --prefill 16 > "$OUT/decode.log" 2>&1
echo "decode rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 150 python -m vgc bench decode --traffic generate --model tiny --calls 200 --record-calls 200 --max-batch 64 > "$OUT/traffic.log" 2>&1
echo "traffic rc=$?" >> "$OUT/summary.txt"
