"""Host and GPU time of one decode-step attention (llama_1b's shapes: 8 KV heads, their 4 grouped queries each,
head dim 64, bf16, a bool padding mask) as `vgc::causal_attention` calls it, with SDPA free to pick cuDNN (the
default on this GPU) and without it (flash / memory-efficient / math). A KV length seen for the first time is what
a dynamic cache brings at every step of a new request; a repeated one is what a benchmark of one prompt repeats.
The two sides alternate (A, B, A, B) on disjoint fresh lengths.

usage: PYTHONPATH=. python benchmarks/device/sdpa_decode_backends.py OUT_DIR"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

out = sys.argv[1]
dev, dt = "cuda", torch.bfloat16
SIDES = {"default (cuDNN allowed)": None,
         "no cuDNN": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}


def call(backends, q, k, v, mask):
    if backends is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)


def inputs(length, batch=1):
    q = torch.randn(batch, 8, 4, 64, device=dev, dtype=dt)
    k = torch.randn(batch, 8, length, 64, device=dev, dtype=dt)
    v = torch.randn(batch, 8, length, 64, device=dev, dtype=dt)
    mask = torch.ones(batch, length, device=dev, dtype=torch.bool)[:, None, None, :]
    return q, k, v, mask


def host_us(backends, lengths, batch=1):
    times = []
    for length in lengths:
        args = inputs(length, batch)
        torch.cuda.synchronize()
        began = time.perf_counter()
        call(backends, *args)
        times.append(1e6 * (time.perf_counter() - began))
        torch.cuda.synchronize()
    return times


def gpu_us(backends, length, batch=1, reps=200):
    args = inputs(length, batch)
    for _ in range(10):
        call(backends, *args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        call(backends, *args)
    end.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(end) / reps


# first use of anything outside the timing
for backends in SIDES.values():
    host_us(backends, [40, 41])
report = {"fresh_lengths_host_us": {name: [] for name in SIDES},
          "repeated_lengths_host_us": {name: [] for name in SIDES}}
base = 100
for rnd in range(4):
    for name, backends in SIDES.items():
        lengths = list(range(base, base + 32))
        base += 1000
        report["fresh_lengths_host_us"][name] += host_us(backends, lengths)
        report["repeated_lengths_host_us"][name] += host_us(backends, lengths)
summary = {}
for kind in ("fresh_lengths_host_us", "repeated_lengths_host_us"):
    for name in SIDES:
        xs = report[kind][name]
        summary[f"{kind} {name}"] = {"median": statistics.median(xs), "p10": sorted(xs)[len(xs) // 10],
                                     "p90": sorted(xs)[9 * len(xs) // 10]}
for batch in (1, 4):
    for length in (128, 512, 2048):
        for rnd in range(2):
            for name, backends in SIDES.items():
                summary.setdefault(f"gpu_us batch {batch} kv {length} {name}", []).append(
                    gpu_us(backends, length, batch))
json.dump({"summary": summary, "raw": report}, open(f"{out}/sdpa_decode_backends.json", "w"), indent=1)
for key, value in summary.items():
    print(key, value)
