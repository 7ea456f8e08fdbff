"""Launch shapes for vgc's one-row decode matmuls, chosen inside the chain a decode step runs (issue 47).

`sweep_skinny_mm.py` times each product alone, back to back. In a decode step each launch is a programmatic
dependent of the one before it and fetches its first weight tile before it waits, so a tile that loads more of its
weights up front (a long `block_k`, programs that all fit at once) can win in the chain and lose alone. Here the
chain is the default decode step's four launches per layer, 16 layers, in one CUDA graph, launched as PDL
dependents: (residual add + RMSNorm + qkv + RoPE), o, (residual add + RMSNorm + gate/up + SiLU-and-multiply),
down. One launch kind at a time takes each tile of the grid while the others keep theirs (coordinate descent, two
passes); each candidate is timed in interleaved rounds against the current choice. Prints the winners as
`GEMV_TILES` / `FUSED_TILES` entries and the chain's time with the defaults and with the winners, against the time
to copy the same weights once.

    PYTHONPATH=. python benchmarks/sweep_chain_tiles.py [--json out.json] [--passes 2] [--budget-s 240]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch

from vgc.ops.triton_skinny_mm import Tile, choose_tile, skinny_mm_into
from vgc.shells.bench.timing import copy_bandwidth_gbs, timed_calls

HIDDEN, KV, HEAD_DIM, INTER = 2048, 512, 64, 8192
QKV = HIDDEN + 2 * KV
# launch kind -> (the weight's N, K, how choose_tile looks it up: norm, paired)
KINDS = {"qkv": (QKV, HIDDEN, True, True), "o": (HIDDEN, HIDDEN, False, False),
         "gate_up": (2 * INTER, HIDDEN, True, True), "down": (HIDDEN, INTER, False, False)}


def grid() -> list[Tile]:
    # Each new tile is a Triton compile (about a second): the grid is kept to shapes that keep at most 128 fp32
    # accumulators per thread (a paired launch's programs hold two weight rows per output pair).
    return [Tile(1, bn, bk, w, 1) for bn, bk, w in itertools.product((1, 2, 4), (512, 1024, 2048), (2, 4, 8))
            if bn * bk // (32 * w) <= 64]


class Chain:
    def __init__(self, layers: int = 16):
        gen = torch.Generator(device="cuda").manual_seed(0)

        def weight(n, k):
            return torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5

        self.weights = [{kind: weight(n, k) for kind, (n, k, _, _) in KINDS.items()} for _ in range(layers)]
        self.x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.norm_w = torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
        position = 7.0
        freqs = position / 10000 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM)
        self.cos, self.sin = (f(freqs).to(torch.bfloat16)[None] for f in (torch.cos, torch.sin))
        self.bytes = sum(w.numel() * 2 for layer in self.weights for w in layer.values())

    def run(self, tiles: dict[str, Tile]):
        x, h, delta = self.x, self.x, torch.zeros_like(self.x)
        for w in self.weights:
            total, q = torch.empty_like(x), x.new_empty(1, QKV)
            skinny_mm_into(q, delta, w["qkv"].t(), tiles["qkv"], pdl=True, norm_weight=self.norm_w, eps=1e-5,
                           residual=h, h=total, rope=(self.cos, self.sin, HIDDEN + KV, HEAD_DIM))
            attn = x.new_empty(1, HIDDEN)
            skinny_mm_into(attn, q[:, :HIDDEN], w["o"].t(), tiles["o"], pdl=True)
            h, total = total, torch.empty_like(x)
            act = x.new_empty(1, INTER)
            skinny_mm_into(act, attn, w["gate_up"].t(), tiles["gate_up"], pdl=True, norm_weight=self.norm_w,
                           eps=1e-5, gated=True, residual=h, h=total)
            delta = x.new_empty(1, HIDDEN)
            skinny_mm_into(delta, act, w["down"].t(), tiles["down"], pdl=True)
            h = total
        return h

    def graph(self, tiles: dict[str, Tile]):
        self.run(tiles)   # compiles the launches outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.run(tiles)
        graph.replay()
        torch.cuda.synchronize()
        return graph, out


def replay_us(graph, reps: int = 7) -> list[float]:
    return [ms * 1e3 for ms in timed_calls(lambda: graph.replay(), {}, reps)]


def compare(graphs: list, rounds: int = 5) -> list[float]:
    """Median µs per replay of each graph, timed in interleaved rounds."""
    samples = [[] for _ in graphs]
    for _ in range(rounds):
        for i, graph in enumerate(graphs):
            samples[i].extend(replay_us(graph))
    return [statistics.median(s) for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=240, help="stop the descent after this long")
    args = parser.parse_args()
    started = time.monotonic()
    copy_gbs = copy_bandwidth_gbs()
    chain = Chain()
    floor_us = chain.bytes / copy_gbs / 1e3
    default = {kind: choose_tile(1, n, k, norm, paired) for kind, (n, k, norm, paired) in KINDS.items()}
    reference, expected = chain.graph(default)
    expected = expected.float().clone()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; weights {chain.bytes / 1e9:.2f} GB; floor {floor_us:.1f} us; "
          f"default tiles {default}", flush=True)
    best = dict(default)
    for p, kind in itertools.product(range(args.passes), KINDS):
        if time.monotonic() - started > args.budget_s:
            print(f"budget spent: stopped before pass {p + 1} {kind}", flush=True)
            break
        current, _ = chain.graph(best)
        found = []
        for tile in grid():
            if tile == best[kind]:
                continue
            try:
                graph, _ = chain.graph({**best, kind: tile})
            except Exception as e:   # noqa: BLE001 - a tile that does not fit (registers, shared memory)
                print(f"  {kind} {tile}: {type(e).__name__}", flush=True)
                continue
            mine, theirs = compare([graph, current], rounds=2)
            found.append((mine - theirs, tile))
            del graph
        found.sort(key=lambda t: t[0])
        if found and found[0][0] < 0:
            # the leader, timed again against the current choice in more rounds before it is taken
            graph, _ = chain.graph({**best, kind: found[0][1]})
            mine, theirs = compare([graph, current], rounds=6)
            print(f"pass {p + 1} {kind}: {found[0][1]} {mine:.1f} us against {best[kind]} {theirs:.1f} us"
                  f" (next: " + "; ".join(f"{d:+.1f} {t}" for d, t in found[1:3]) + ")", flush=True)
            if mine < theirs:
                best[kind] = found[0][1]
        else:
            print(f"pass {p + 1} {kind}: {best[kind]} kept", flush=True)
    final, out = chain.graph(best)
    error = ((out.float() - expected).norm() / expected.norm()).item()
    t_default, t_best = compare([reference, final], rounds=10)
    print(f"chain of 16 layers, one row: default tiles {t_default:.1f} us ({floor_us / t_default:.0%} of the copy "
          f"floor's speed), chosen tiles {t_best:.1f} us ({floor_us / t_best:.0%}); output against the default tiles' "
          f"{error:.1e} (relative)", flush=True)
    gemv = {(1, n, k): best[kind] for kind, (n, k, norm, _) in KINDS.items() if not norm}
    fused = {(n, k, paired): best[kind] for kind, (n, k, norm, paired) in KINDS.items() if norm}
    print("GEMV_TILES entries: " + "; ".join(f"{key}: {tile}" for key, tile in gemv.items()))
    print("FUSED_TILES entries: " + "; ".join(f"{key}: {tile}" for key, tile in fused.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbs": copy_gbs, "floor_us": floor_us, "default_us": t_default, "chosen_us": t_best,
                       "gemv_tiles": [[list(k), t.__dict__] for k, t in gemv.items()],
                       "fused_tiles": [[list(k), t.__dict__] for k, t in fused.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
