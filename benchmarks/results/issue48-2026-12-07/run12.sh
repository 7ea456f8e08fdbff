#!/usr/bin/env bash
# Third session of 2026-12-07, fifth device call, this main: the first 40 s of a transformers generate() loop in
# fresh processes (anchor, vgc integration, vgc integration tiered), every cache empty, bytecode under a prefix
# written by the first process (issue 48's target: the integration's first generate() of a cold process).
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
C=$(mktemp -d); export VGC_CACHE_ROOT=$C/vgc TRITON_CACHE_DIR=$C/triton CUDA_CACHE_PATH=$C/cuda TORCHINDUCTOR_CACHE_DIR=$C/inductor
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$C/pyc PYTHONPATH=.
python -c "import torch, transformers, vgc.integrations.transformers" 2>/dev/null   # writes the bytecode
timeout 300 python -m vgc bench startup --generate 40 --json $OUT/generate40.json 2>&1 | grep -v Warn | tee $OUT/generate40.txt | tail -20
echo "done at ${SECONDS}s"
