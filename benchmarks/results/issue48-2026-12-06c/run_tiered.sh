#!/usr/bin/env bash
# Issue 48, session of 2026-12-06 (c): a tiered cold start whose first tier serves on breakable graphs
# (vgc.compile, llama_1b, full_and_piecewise), then the first seconds of a transformers generate() loop in fresh
# processes (anchor, integration, integration tiered). Every cache starts empty (the benches make their own).
set -uo pipefail
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
timeout 150 python -m vgc bench startup --strategy tiered --cudagraph-mode full_and_piecewise --warm-runs 0 \
    --no-bundle --json $OUT/tiered.json > $OUT/tiered.txt 2>&1
echo "tiered rc $? at ${SECONDS}s"; grep -v "^\s*$" $OUT/tiered.txt | tail -8
[ $SECONDS -lt 150 ] && timeout $(( 320 - SECONDS )) python -m vgc bench startup --generate 25 --json $OUT/generate.json \
    > $OUT/generate.txt 2>&1; echo "generate rc $? at ${SECONDS}s"; tail -12 $OUT/generate.txt
