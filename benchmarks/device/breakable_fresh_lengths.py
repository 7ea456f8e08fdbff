"""llama_1b (bf16, batch 1) under generate() with breakable graphs on the default dynamic cache, each request a
prompt length no earlier one had (so every decode step meets a KV length for the first time, as a server does),
with vgc::causal_attention's SDPA free to pick cuDNN and without it. Alternating A, B, A, B; ms per new token.

usage: PYTHONPATH=. python benchmarks/device/breakable_fresh_lengths.py OUT_DIR"""
import importlib
import json
import statistics
import sys
import time

import torch

from vgc.bench.generate import _build, _shape
from vgc.integrations import transformers as vgc_transformers

op = importlib.import_module("vgc.ops.causal_attention")   # the module (vgc.ops.causal_attention is the op)

out = sys.argv[1]
SIDES = {"cuDNN allowed": None, "no cuDNN (vgc default)": op.BACKENDS}
NEW = 32
model = _build(_shape("llama_1b", None), "cuda", torch.bfloat16)
vgc_transformers.breakable(model, batch_sizes=[1])
results = {name: [] for name in SIDES}
prompt = 100
for rnd in range(4):
    for name, backends in SIDES.items():
        op.BACKENDS = backends
        ids = torch.randint(1, 1000, (1, prompt), device="cuda")
        prompt += NEW + 8   # the next request's KV lengths are all new
        torch.cuda.synchronize()
        began = time.perf_counter()
        model.generate(input_ids=ids, max_new_tokens=NEW, do_sample=False)
        torch.cuda.synchronize()
        results[name].append(1000 * (time.perf_counter() - began) / NEW)
summary = {name: {"median_ms_per_token": statistics.median(xs), "all": xs} for name, xs in results.items()}
summary["stats"] = model.vgc_breakable.stats()["model_counters"]
json.dump(summary, open(f"{out}/breakable_fresh_lengths.json", "w"), indent=1, default=str)
for name in SIDES:
    print(name, summary[name])
