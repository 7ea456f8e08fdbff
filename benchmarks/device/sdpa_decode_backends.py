"""Host time of one decode-step `vgc::causal_attention` at llama_1b's shapes (32 query heads on 8 KV heads, head
dim 64, bf16, batch 1 and 4, a padding mask), three ways: SDPA free to pick cuDNN (its first choice on Hopper) with
generate()'s bool mask (vgc before 2026-12-04); cuDNN kept out, bool mask; cuDNN kept out, the additive bias made
once per step (`padding_bias`, vgc now; its own cost, once per step, reported apart). A KV length seen for the first
time is what a dynamic cache brings at every step of a new request; a repeated one is what a benchmark repeating
one prompt sees. The sides alternate (A, B, C, A, B, C) on disjoint fresh lengths.

usage: PYTHONPATH=. python benchmarks/device/sdpa_decode_backends.py OUT_DIR"""
import importlib
import json
import statistics
import sys
import time

import torch

op = importlib.import_module("vgc.ops.causal_attention")
choice = importlib.import_module("vgc.ops.sdpa")
out = sys.argv[1]
dev, dt = "cuda", torch.bfloat16
SIDES = {"cuDNN allowed, bool mask": (False, "bool"), "no cuDNN, bool mask": (True, "bool"),
         "no cuDNN, bias (vgc)": (True, "bias")}


def inputs(length, batch, mask_kind):
    q = torch.randn(batch, 32, 1, 64, device=dev, dtype=dt)
    k = torch.randn(batch, 8, length, 64, device=dev, dtype=dt)
    v = torch.randn(batch, 8, length, 64, device=dev, dtype=dt)
    mask = torch.ones(batch, length, device=dev, dtype=torch.bool)
    mask[-1, :3] = False
    return q, k, v, (op.padding_bias(mask, dt) if mask_kind == "bias" else mask)


def host_us(side, lengths, batch):
    choice.AVOID_CUDNN, kind = side
    times = []
    for length in lengths:
        args = inputs(length, batch, kind)
        torch.cuda.synchronize()
        began = time.perf_counter()
        torch.ops.vgc.causal_attention(*args, 0.125, None)
        times.append(1e6 * (time.perf_counter() - began))
        torch.cuda.synchronize()
    return times


for side in SIDES.values():   # first use of everything outside the timing
    host_us(side, [40, 41], 1)
raw, base = {}, 100
for batch in (1, 4):
    for rnd in range(3):
        for name, side in SIDES.items():
            lengths = list(range(base, base + 24))
            base += 1000
            raw.setdefault(f"batch {batch} fresh {name}", []).extend(host_us(side, lengths, batch))
            raw.setdefault(f"batch {batch} repeated {name}", []).extend(host_us(side, lengths, batch))
mask = torch.ones(4, 777, device=dev, dtype=torch.bool)
times = []
for _ in range(50):
    torch.cuda.synchronize()
    began = time.perf_counter()
    op.padding_bias(mask, dt)
    times.append(1e6 * (time.perf_counter() - began))
raw["padding_bias once per step"] = times
summary = {key: {"median": statistics.median(xs), "p10": sorted(xs)[len(xs) // 10],
                 "p90": sorted(xs)[9 * len(xs) // 10], "n": len(xs)} for key, xs in raw.items()}
json.dump({"summary": summary, "raw": raw}, open(f"{out}/sdpa_decode_backends.json", "w"), indent=1)
for key, value in summary.items():
    print(f"{key:45s} median {value['median']:9.1f} us  p10 {value['p10']:9.1f}  p90 {value['p90']:9.1f}")
