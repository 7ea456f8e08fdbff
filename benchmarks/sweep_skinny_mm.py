"""Launch shapes for `vgc::skinny_mm`'s kernel, swept on the GPU against cuBLAS (`torch.mm`).

For Llama-3.2-1B's four projection shapes and each row count the kernel takes: the device time of each product, as
the weights' bytes per second, for cuBLAS and for every tile in the grid below, each measured inside a CUDA graph of
32 back-to-back products over rotating weight copies (so that neither host launches nor L2 hits flatter a kernel).
It prints the winners as `GEMV_TILES` (vgc/ops/triton_skinny_mm.py) takes them.

Then the chain a decode step runs: 16 layers of qkv -> o -> gate/up -> down, each product reading the one before,
captured in one graph: cuBLAS, vgc's kernels with ordinary launches, and vgc's kernels as programmatic dependent
launches (PDL), against the time to copy the same weights once.

With `--fused`, the same for the one-row launches that carry their neighbours (what the `skinny_matmul_fusion`
pass makes): qkv and gate/up with the residual add and RMSNorm before them (gate/up also gating:
SiLU-and-multiply); the winners printed as `FUSED_TILES`; and the decode chain with them.

    PYTHONPATH=. python benchmarks/sweep_skinny_mm.py [--json out.json] [--rows 1,2,4,8] [--fused]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from vgc.shells.bench.timing import copy_bandwidth_gbs
from vgc.ops import triton_skinny_mm
from vgc.ops.triton_skinny_mm import GEMV_MAX_M, Tile, choose_tile, skinny_mm_into

SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}   # (N, K)
# The fused launches a Llama layer makes (residual add + RMSNorm + product): (shape, gated)
FUSED = {"qkv": ("qkv", False), "gate_up": ("gate_up", True)}


def gemv_grid(block_m: int) -> list[tuple[int, int, int, int]]:
    widths = (1, 2, 4, 8, 16) if block_m == 1 else (1, 2, 4)
    return [(bn, bk, w, 1) for bn, bk, w in itertools.product(widths, (128, 256, 512, 1024, 2048), (2, 4, 8))
            if block_m * bn * bk // (32 * w) <= 128]   # fp32 accumulator elements per thread


def graph_us(fn, copies: int, calls: int = 32, reps: int = 10) -> float:
    """Device µs per call of fn(i) (i picks a weight copy), from CUDA-graph replays of `calls` calls."""
    for i in range(copies):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--rows", default="1,2,4,8",
                        help="row counts of `a`, at most GEMV_MAX_M; 'none': no plain sweep (default: %(default)s)")
    parser.add_argument("--fused", action="store_true", help="also sweep the fused one-row launches")
    args = parser.parse_args()
    copy_gbs = copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s")
    results = []
    best_gemv = {}
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, -(-(200 << 20) // nbytes))   # > 200 MiB of weights per cycle: beyond the L2
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for m in [] if args.rows == "none" else [int(r) for r in args.rows.split(",")]:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            cublas = graph_us(lambda i: torch.mm(a, weights[i].t(), out=out), copies)
            ref = (a.float() @ weights[0].float().t())
            row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": cublas, "cublas_gbs": nbytes / cublas / 1e3}
            if m <= GEMV_MAX_M:
                tiles = []
                block_m = 1 << (m - 1).bit_length()
                for tile in [Tile(block_m, *t) for t in gemv_grid(block_m)]:
                    try:
                        skinny_mm_into(out, a, weights[0].t(), tile)
                        torch.cuda.synchronize()
                        err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
                        if err > 2e-2:
                            print(f"  {name} m={m} {tile}: wrong (rel err {err:.3g})")
                            continue
                        us = graph_us(lambda i: skinny_mm_into(out, a, weights[i].t(), tile), copies)
                    except Exception as e:   # noqa: BLE001 - a tile that does not fit (registers, shared memory)
                        print(f"  {name} m={m} {tile}: {type(e).__name__}")
                        continue
                    tiles.append((us, tile))
                tiles.sort(key=lambda t: t[0])
                best_gemv[(block_m, n, k)] = tiles[0][1]
                default = choose_tile(m, n, k)
                default_us = graph_us(lambda i: skinny_mm_into(out, a, weights[i].t()), copies)
                row.update(best_us=tiles[0][0], best_gbs=nbytes / tiles[0][0] / 1e3, best=tiles[0][1].__dict__,
                           top5=[(us, t.__dict__) for us, t in tiles[:5]], default=default.__dict__,
                           default_us=default_us, default_gbs=nbytes / default_us / 1e3)
            results.append(row)
            line = f"{name:8s} m={m:4d}  cublas {row['cublas_us']:7.2f} us {row['cublas_gbs']:6.0f} GB/s"
            if "best_us" in row:
                line += (f" | best {row['best_us']:7.2f} us {row['best_gbs']:6.0f} GB/s {row['best']}"
                         f" | default {row['default_us']:7.2f} us {row['default_gbs']:6.0f} GB/s")
            print(line, flush=True)
        weights.clear()
    triton_skinny_mm.GEMV_TILES.update(best_gemv)   # the chain runs the winners
    print("GEMV_TILES = {" + "".join(f"\n    {key}: Tile{tuple(t.__dict__.values())}," for key, t in best_gemv.items())
          + "\n}")
    best_fused = sweep_fused() if args.fused else {}
    triton_skinny_mm.FUSED_TILES.update(best_fused)
    chain = chain_us(fused=args.fused)
    chain["floor_us"] = sum(n * k * 2 for n, k in SHAPES.values()) * 16 / copy_gbs / 1e3
    print("decode chain, 16 layers x 4 products, one row: " + ", ".join(f"{k} {v:.1f} us" for k, v in chain.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbs": copy_gbs, "products": results, "chain_us": chain,
                       "gemv_tiles": [[list(key), t.__dict__] for key, t in best_gemv.items()],
                       "fused_tiles": [[list(key), t.__dict__] for key, t in best_fused.items()]}, f, indent=1)


def sweep_fused() -> dict[tuple, Tile]:
    """Each fused launch of a layer over the tile grid at one row; prints the winners against the plain launch."""
    best = {}
    for name, (shape, gated) in FUSED.items():
        n, k = SHAPES[shape]
        nbytes = n * k * 2
        copies = max(2, -(-(200 << 20) // nbytes))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(copies)]
        a, residual = (torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        norm_w = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
        out_n = n // 2 if gated else n
        out, h = torch.empty(1, out_n, device="cuda", dtype=torch.bfloat16), torch.empty_like(a)
        x = a.double() + residual.double()
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w.double() @ weights[0].double().t()
        if gated:
            ref = torch.nn.functional.silu(ref[:, :out_n]) * ref[:, out_n:]

        def launch(i, tile):
            skinny_mm_into(out, a, weights[i].t(), tile, norm_weight=norm_w, eps=1e-5, gated=gated,
                           residual=residual, h=h)

        tiles = []
        for tile in [Tile(1, *t) for t in gemv_grid(1) if t[0] <= 8 and t[1] <= 1024]:
            try:
                launch(0, tile)
                torch.cuda.synchronize()
                err = (out.double() - ref).abs().max().item() / ref.abs().max().item()
                if err > 2e-2:
                    print(f"  fused {name} {tile}: wrong (rel err {err:.3g})")
                    continue
                tiles.append((graph_us(lambda i: launch(i, tile), copies), tile))
            except Exception as e:   # noqa: BLE001 - a tile that does not fit
                print(f"  fused {name} {tile}: {type(e).__name__}")
        tiles.sort(key=lambda t: t[0])
        best[(n, k, gated)] = tiles[0][1]
        plain = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        plain_us = graph_us(lambda i: skinny_mm_into(plain, a, weights[i].t()), copies)
        print(f"fused {name:8s} best {tiles[0][0]:7.2f} us {nbytes / tiles[0][0] / 1e3:6.0f} GB/s {tiles[0][1]}"
              f" | plain launch {plain_us:7.2f} us | top3 " + "; ".join(f"{us:.2f} {t}" for us, t in tiles[1:3]),
              flush=True)
    print("FUSED_TILES = {" + "".join(f"\n    {key}: Tile{tuple(t.__dict__.values())}," for key, t in best.items())
          + "\n}")
    return best


def chain_us(layers: int = 16, fused: bool = False) -> dict[str, float]:
    """Device µs of one decode step's products (one row), each reading the previous one's output, in one graph."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5
                for n, k in SHAPES.values()] for _ in range(layers)]
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)

    def step(mm):
        h = x
        for qkv, o, gate_up, down in weights:
            h = mm(mm(h, qkv.t())[:, :2048], o.t())
            h = mm(mm(h, gate_up.t())[:, :8192], down.t())
        return h

    def ours(pdl):
        def mm(a, b):
            out = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=a.dtype)
            skinny_mm_into(out, a.contiguous(), b, pdl=pdl)
            return out
        return mm

    norm_w = torch.rand(x.shape[1], device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5

    def fused_step(pdl):
        # A layer as the fusion pass leaves it: (residual add + norm + qkv), o, (residual add + norm + gate/up +
        # gate), down
        def run():
            h, delta = x, torch.zeros_like(x)
            for qkv, o, gate_up, down in weights:
                total, q = torch.empty_like(x), x.new_empty(1, qkv.shape[0])
                skinny_mm_into(q, delta, qkv.t(), pdl=pdl, norm_weight=norm_w, eps=1e-5, residual=h, h=total)
                attn = x.new_empty(1, o.shape[0])
                skinny_mm_into(attn, q[:, :o.shape[1]], o.t(), pdl=pdl)
                h, total = total, torch.empty_like(x)
                act = x.new_empty(1, gate_up.shape[0] // 2)
                skinny_mm_into(act, attn, gate_up.t(), pdl=pdl, norm_weight=norm_w, eps=1e-5, gated=True,
                               residual=h, h=total)
                delta = x.new_empty(1, down.shape[0])
                skinny_mm_into(delta, act, down.t(), pdl=pdl)
                h = total
            return h
        return run

    reference = step(torch.mm).float()
    times = {}
    for name, mm in (("cublas", torch.mm), ("vgc", ours(False)), ("vgc pdl", ours(True))):
        got = step(mm).float()
        error = ((got - reference).norm() / reference.norm()).item()
        print(f"  chain {name}: relative error against cuBLAS {error:.2e}")
        times[name] = graph_us(lambda i: step(mm), 1, calls=4)
    if fused:   # the same bytes and also each layer's norms, gate and residual adds (a copy per layer included)
        for name, run in (("vgc fused", fused_step(False)), ("vgc fused pdl", fused_step(True))):
            times[name] = graph_us(lambda i: run(), 1, calls=4)
    return times


if __name__ == "__main__":
    main()
