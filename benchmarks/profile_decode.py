"""Where a batch-1 decode step of llama_1b spends its time under vgc's CUDA graphs (H200).

Prints, for FULL graphs: the GPU kernels of one replay (count, time per kernel class, sum vs wall), for a few
Inductor option sets; for PIECEWISE: the host time of one step and where it goes (cProfile).

    PYTHONPATH=. python benchmarks/profile_decode.py [--variants default,pdl,static1+cdt,static1+cdt+pdl]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time

import torch

import vgc
from vgc.shells.bench.timing import device_events, time_steps
from vgc.models import llama

VARIANTS = {
    "default": {},
    "static1": {"compile_sizes": [1]},
    # With coordinate-descent tuning, Inductor turns a static M=1 matmul into a reduction it can fuse.
    "static1+cdt": {"compile_sizes": [1], "inductor_compile_config": {"coordinate_descent_tuning": True}},
    "static1+combo": {"compile_sizes": [1], "inductor_compile_config": {"combo_kernels": True}},
    # Programmatic dependent launch: a kernel may start while its predecessor drains.
    "pdl": {"inductor_compile_config": {"triton.enable_pdl": True}},
    "static1+cdt+pdl": {"compile_sizes": [1], "inductor_compile_config": {"coordinate_descent_tuning": True,
                                                                           "triton.enable_pdl": True}},
    "autotune": {"compile_sizes": [1], "inductor_compile_config": {"max_autotune": True,
                                                                    "coordinate_descent_tuning": True}},
}


def step_ms(fn, batch, steps=100):
    return time_steps(fn, batch, warmup=10, steps=steps)


def kernel_table(fn, batch, steps=20):
    events = device_events(fn, batch, steps, warmup=5)
    per_kernel = collections.defaultdict(lambda: [0, 0.0])
    for event in events:
        name = event.name[:90]
        per_kernel[name][0] += 1
        per_kernel[name][1] += event.device_time_total if hasattr(event, "device_time_total") \
            else event.cuda_time_total
    kernels = sorted(events, key=lambda e: e.time_range.start)
    gap_before = collections.defaultdict(float)
    for before, after in zip(kernels, kernels[1:]):
        gap = after.time_range.start - before.time_range.end
        if 0 < gap < 50:   # within a step (steps are further apart)
            gap_before[after.name[:60]] += gap
    total_gap = sum(gap_before.values()) / steps
    print(f"    idle GPU between kernels within a step: {total_gap:.1f} us; most before:",
          ", ".join(f"{name} {t / steps:.0f} us" for name, t in sorted(gap_before.items(), key=lambda kv: -kv[1])[:4]))
    total_us = sum(t for _, t in per_kernel.values()) / steps
    count = sum(n for n, _ in per_kernel.values()) / steps
    print(f"    kernels per step: {count:.0f}, kernel time per step: {total_us:.1f} us")
    for name, (n, t) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"    {t / steps:8.1f} us  {n / steps:5.1f}x  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="default,pdl,static1+cdt,static1+cdt+pdl")
    args = parser.parse_args()
    cfg = llama.llama_1b_config()
    model = llama.Llama(cfg).cuda().eval()
    kv = llama.make_kv_caches(cfg, "cuda")
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)
    print(f"weights read per step: {weight_bytes / 1e9:.2f} GB")
    decode = lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv)  # noqa: E731
    prefill = lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv)  # noqa: E731

    # Raw GEMV roofline: the 4 projections of one layer as plain torch matmuls at M=1, captured in one graph.
    x = torch.randn(1, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
    layer = model.layers[0]
    with torch.no_grad():
        def gemvs():
            for _ in range(16):
                a = torch.nn.functional.linear(x, layer.qkv_proj.weight)
                b = torch.nn.functional.linear(x, layer.o_proj.weight)
                c = torch.nn.functional.linear(x, layer.gate_up_proj.weight)
                d = torch.nn.functional.linear(c[:, :cfg.intermediate_size], layer.down_proj.weight)
            return a, b, d
        gemvs()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gemvs()
        replay = lambda **_: g.replay()  # noqa: E731
        print(f"64 cuBLAS GEMVs (16 layers' projections) in one graph: {step_ms(replay, {}):.3f} ms")
        print("  kernels of that graph:")
        kernel_table(replay, {})

    for variant in args.variants.split(","):
        extra = VARIANTS[variant]
        torch.compiler.reset()
        try:
            vgc.CompilationConfig(**extra)
        except ValueError as e:   # an Inductor option this torch lacks
            print(f"\nFULL [{variant}] skipped: {e}")
            continue
        start = time.perf_counter()
        config = vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[1, 8], **extra)
        compiled = vgc.compile(model, config=config, pad_values=llama.PAD_VALUES,
                               uniform_decode=llama.is_uniform_decode)
        compiled.warmup(prefill, make_decode_inputs=decode)
        batch = decode(1)
        graph = compiled.graphs.full[1].graph
        print(f"\nFULL [{variant}] warm-up {time.perf_counter() - start:.1f} s; "
              f"decode 1: {step_ms(compiled, batch):.3f} ms; the graph's replay alone: "
              f"{step_ms(lambda **_: graph.replay(), {}):.3f} ms")
        kernel_table(compiled, batch)

    torch.compiler.reset()
    config = vgc.CompilationConfig(cudagraph_mode="piecewise", cudagraph_capture_sizes=[1, 8])
    compiled = vgc.compile(model, config=config, pad_values=llama.PAD_VALUES)
    compiled.warmup(prefill)
    batch = decode(1)
    print(f"\nPIECEWISE decode 1: {step_ms(compiled, batch):.3f} ms")
    for piece in compiled.graphs.runtime.pieces:
        entry = piece.entries.get(1)
        if entry is not None:
            print(f"  {piece.name}: copied in {len(entry.copy_targets)}, read in place {entry.pinned_at}")
    kernel_table(compiled, batch)
    torch.cuda.synchronize()
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        compiled(**batch)
    host = (time.perf_counter() - start) / n
    torch.cuda.synchronize()
    print(f"  host time per step (no sync): {host * 1e3:.3f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        compiled(**batch)
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
