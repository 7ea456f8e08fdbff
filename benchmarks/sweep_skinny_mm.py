"""Launch shapes for `vgc::skinny_mm`'s kernel, swept on the GPU against cuBLAS (`torch.mm`).

For Llama-3.2-1B's four projection shapes and several row counts: the device time of each product, as the weights'
bytes per second, for cuBLAS and for every tile in the grid below, each measured inside a CUDA graph of 32
back-to-back products over rotating weight copies (so that neither host launches nor L2 hits flatter a kernel).

    PYTHONPATH=. python benchmarks/sweep_skinny_mm.py [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from vgc.bench.timing import copy_bandwidth_gbs
from vgc.ops.triton_skinny_mm import Tile, choose_tile, skinny_mm_into

SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}   # (N, K)
ROWS = [1, 8, 32, 64, 128]


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
    args = parser.parse_args()
    print(f"copy bandwidth: {copy_bandwidth_gbs():.0f} GB/s")
    grid = [(bn, bk, w, st) for bn, bk, (w, st) in itertools.product(
        (16, 32, 64), (128, 256, 512), ((4, 3), (4, 5), (8, 4)))]
    results = []
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, -(-(200 << 20) // nbytes))   # > 200 MiB of weights per cycle: beyond the L2
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for m in ROWS:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            cublas = graph_us(lambda i: torch.mm(a, weights[i].t(), out=out), copies)
            ref = (a.float() @ weights[0].float().t())
            row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": cublas, "cublas_gbs": nbytes / cublas / 1e3}
            if m <= 64:
                tiles = []
                for bn, bk, w, st in grid:
                    tile = Tile(max(16, 1 << (m - 1).bit_length()), bn, bk, w, st)
                    try:
                        skinny_mm_into(out, a, weights[0].t(), tile)
                        torch.cuda.synchronize()
                        err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
                        if err > 2e-2:
                            print(f"  {name} m={m} {tile}: wrong (rel err {err:.3g})")
                            continue
                        us = graph_us(lambda i: skinny_mm_into(out, a, weights[i].t(), tile), copies)
                    except Exception as e:   # noqa: BLE001 - a tile that does not fit (shared memory)
                        print(f"  {name} m={m} {tile}: {type(e).__name__}")
                        continue
                    tiles.append((us, tile))
                tiles.sort(key=lambda t: t[0])
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
