"""llama_1b (bf16, batch 1) under transformers generate(), each request a prompt length no earlier one had (so
prefill and every decode step meet new shapes, as on a server), with vgc's attention ops' SDPA free to pick cuDNN
and without it (vgc's default, `vgc.ops.sdpa`). Rows: `vgc.integrations.transformers.breakable` (default dynamic
cache) and `vgc.integrations.transformers.compile` (Inductor pieces, vgc's static cache). Per request: time to the
first token (max_new_tokens=1) and ms per token over 32 new tokens; sides alternate (A, B, A, B).
(Call 5 of 2026-12-04 ran the first version of this script, breakable row and ms per token only.)

usage: PYTHONPATH=. python benchmarks/device/fresh_lengths.py OUT_DIR [ROW ...]"""
import importlib
import json
import statistics
import sys
import time

import torch

from vgc.shells.bench.generate import _build, _shape
from vgc.integrations import transformers as vgc_transformers

choice = importlib.import_module("vgc.ops.sdpa")
out = sys.argv[1]
ROWS = sys.argv[2:] or ["breakable", "integration"]
SIDES = {"cuDNN allowed": False, "no cuDNN (vgc default)": True}
NEW = 32
prompt = 100


def fresh_ids():
    global prompt
    ids = torch.randint(1, 1000, (1, prompt), device="cuda")
    prompt += NEW + 8   # the next request's lengths are all new
    return ids


def timed(model, ids, new):
    torch.cuda.synchronize()
    began = time.perf_counter()
    model.generate(input_ids=ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - began


summary = {}
for row in ROWS:
    model = _build(_shape("llama_1b", None), "cuda", torch.bfloat16)
    began = time.perf_counter()
    if row == "breakable":
        vgc_transformers.breakable(model, batch_sizes=[1])
    else:
        vgc_transformers.compile(model, max_batch_size=1)
    summary[f"{row} prepare s"] = time.perf_counter() - began
    timed(model, fresh_ids(), 4)   # first use outside the timing
    results = {name: {"first token ms": [], "ms per token": []} for name in SIDES}
    for rnd in range(3):
        for name, avoid in SIDES.items():
            choice.AVOID_CUDNN = avoid
            results[name]["first token ms"].append(1000 * timed(model, fresh_ids(), 1))
            results[name]["ms per token"].append(1000 * timed(model, fresh_ids(), NEW) / NEW)
    choice.AVOID_CUDNN = True
    for name, measures in results.items():
        for measure, xs in measures.items():
            summary[f"{row} | {name} | {measure}"] = {"median": statistics.median(xs), "all": xs}
            print(f"{row:12s} {name:24s} {measure:15s} median {statistics.median(xs):9.2f}  all "
                  f"{[round(x, 2) for x in xs]}", flush=True)
    del model
    torch.cuda.empty_cache()
json.dump(summary, open(f"{out}/fresh_lengths.json", "w"), indent=1, default=str)
