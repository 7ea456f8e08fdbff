"""Issue 26: vgc::attention's two eager-or-graphed attention paths on the GPU, variant against variant.

1. Decode: the decode kernel's variants (a program per query head, or per KV head holding its group of query
   heads, scored with FMAs or on tensor cores; BLOCK_N; warps), each launched once per layer for a Llama-3.2-1B
   step (16 layers, each with its own cache, so that nothing stays in L2 between layers), inside one CUDA graph.
   Device time per launch, median of alternating rounds. Outputs checked against the current default.
2. Fresh prefill (4 new sequences of 128 tokens): the op per layer with the flash varlen launch against the
   per-sequence path it replaces, host and device time per 16-layer step (eager, as between piece graphs).

    python benchmarks/sweep_decode_attention.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from vgc.models import llama
from vgc.ops import triton_attention

attention_module = importlib.import_module("vgc.ops.attention")   # the package's `attention` is the op

VARIANTS = [("head", 32, 4, 1), ("head", 16, 1, 1), ("grouped-dot", 32, 4, 1), ("grouped-dot", 64, 4, 1),
            ("grouped-dot", 64, 4, 2), ("grouped-dot", 64, 4, 4), ("grouped-dot", 64, 4, 16),
            ("grouped-dot", 32, 4, 16), None]   # None: the default for the batch size


def _decode_case(cfg, batch: int, context: int | None):
    """One decode step's op arguments for every layer: contexts as `vgc bench decode` (1 + 7i mod 29) when
    `context` is None, else `context` cached tokens each."""
    contexts = [1 + (7 * i) % 29 if context is None else context for i in range(batch)]
    bs = cfg.block_size
    width = max(-(-(c + 1) // bs) for c in contexts)
    blocks = torch.randperm(batch * width, device="cuda").int().view(batch, width)
    seq_lens = torch.tensor([c + 1 for c in contexts], dtype=torch.int32, device="cuda")
    last = seq_lens.long() - 1
    slot_mapping = blocks.long().gather(1, (last // bs)[:, None])[:, 0] * bs + last % bs
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layers = []
    for _ in range(cfg.num_layers):
        cache = torch.randn(2, batch * width, bs, hkv, d, device="cuda", dtype=cfg.dtype)
        layers.append(dict(query=torch.randn(batch, hq, d, device="cuda", dtype=cfg.dtype),
                           key=torch.randn(batch, hkv, d, device="cuda", dtype=cfg.dtype),
                           value=torch.randn(batch, hkv, d, device="cuda", dtype=cfg.dtype),
                           key_cache=cache[0], value_cache=cache[1], output=torch.empty(batch, hq, d, device="cuda",
                                                                                          dtype=cfg.dtype)))
    return layers, dict(slot_mapping=slot_mapping, block_table=blocks, seq_lens=seq_lens, scale=d ** -0.5)


def _launch_all(layers, shared, variant):
    for layer in layers:
        triton_attention.decode_attention(layer["output"], layer["query"], layer["key"], layer["value"],
                                          layer["key_cache"], layer["value_cache"], shared["slot_mapping"],
                                          shared["block_table"], shared["seq_lens"], shared["scale"],
                                          variant=variant)


def _graph(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _device_ms(graph, replays: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def sweep_decode(cfg, rounds: int) -> None:
    print(f"decode attention, {cfg.num_layers} launches per step (one per layer), device us per launch, median of "
          f"{rounds} alternating rounds (spread)")
    print(f"{'batch':>5} {'context':>8} " + " ".join(f"{'/'.join(map(str, v or ['default'])):>17}" for v in VARIANTS))
    for batch, context in ((1, None), (8, None), (64, None), (256, None), (1, 512), (8, 512), (64, 512),
                           (1, 4000), (8, 2048), (64, 2048)):
        layers, shared = _decode_case(cfg, batch, context)
        graphs, reference = {}, None
        for variant in VARIANTS:
            _launch_all(layers, shared, variant)
            out = layers[-1]["output"].float().clone()
            if reference is None:
                reference = out
            elif not torch.allclose(out, reference, atol=3e-2, rtol=0):
                print(f"  {variant} differs from {VARIANTS[0]}: max {(out - reference).abs().max().item():.3g}")
            graphs[variant] = _graph(lambda v=variant: _launch_all(layers, shared, v))
        times = {v: [] for v in VARIANTS}
        for r in range(rounds):
            for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                times[v].append(_device_ms(graphs[v]) * 1000 / cfg.num_layers)
        cells = [f"{statistics.median(t):6.2f} ({min(t):5.2f}-{max(t):5.2f})" for t in times.values()]
        print(f"{batch:>5} {context or '2-30':>8} " + " ".join(f"{c:>17}" for c in cells), flush=True)


def sweep_prefill(cfg, rounds: int) -> None:
    batch = llama.make_batch(cfg, 512, "prefill", device="cuda")
    hq, hkv, d, n = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 512
    caches = llama.make_kv_caches(cfg, "cuda")
    layers = [dict(query=torch.randn(n, hq, d, device="cuda", dtype=cfg.dtype),
                   key=torch.randn(n, hkv, d, device="cuda", dtype=cfg.dtype),
                   value=torch.randn(n, hkv, d, device="cuda", dtype=cfg.dtype), key_cache=c[0], value_cache=c[1],
                   output=torch.empty(n, hq, d, device="cuda", dtype=cfg.dtype)) for c in caches]
    signature = (layers[0]["query"].device, cfg.dtype, d)

    def step():
        run = attention_module.lengths_read_once(lambda: [torch.ops.vgc.attention(
            **layer, slot_mapping=batch["slot_mapping"], block_table=batch["block_table"],
            seq_lens=batch["seq_lens"], query_start_loc=batch["query_start_loc"], scale=d ** -0.5)
            for layer in layers])
        run()

    def side(flash: bool):
        if flash:
            attention_module._flash_refused.discard(signature)
        else:
            attention_module._flash_refused.add(signature)

    outs = {}
    for flash in (False, True):
        side(flash)
        step()
        outs[flash] = layers[-1]["output"].float().clone()
    print(f"\nfresh prefill 512 (4 x 128), {cfg.num_layers} op calls per step: flash vs per-sequence, max |diff| "
          f"{(outs[True] - outs[False]).abs().max().item():.3g}")
    results = {False: ([], []), True: ([], [])}
    for r in range(rounds * 2):
        flash = r % 2 == 1
        side(flash)
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        results[flash][0].append(host * 1000)
        results[flash][1].append((time.perf_counter() - start) * 1000)
    for flash, (host, total) in results.items():
        print(f"  {'flash varlen' if flash else 'per sequence'}: host {statistics.median(host):.3f} ms "
              f"({min(host):.3f}-{max(host):.3f}), host + device {statistics.median(total):.3f} ms "
              f"({min(total):.3f}-{max(total):.3f})")
    side(True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cfg = llama.llama_1b_config()
    print(torch.cuda.get_device_name(), torch.__version__)
    sweep_decode(cfg, args.rounds)
    sweep_prefill(cfg, args.rounds * 4)


if __name__ == "__main__":
    main()
