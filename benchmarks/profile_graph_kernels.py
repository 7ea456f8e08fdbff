"""The kernels of one FULL decode-graph replay, side by side: vgc's own Llama (`vgc.compile`) and an unmodified
transformers Llama through `vgc.integrations.transformers` (investigation, not a test).

For each: the kernels of one replay in launch order (median GPU µs of 10 replays each), their sum against the
replay's wall time, and the kernels grouped by name. Where the two graphs differ is where the integration's
decode step loses time against vgc's own.

    PYTHONPATH=. python benchmarks/profile_graph_kernels.py [--batch 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics

import torch

from vgc.shells.bench.timing import device_events, llama_on_cuda, warm_llama


def replay_kernels(replay, replays: int = 10) -> tuple[list[tuple[str, float]], float]:
    """([(kernel name, median µs)] of one replay in order, median wall µs of a replay from first start to last
    end)."""
    events = sorted(device_events(lambda: replay(), {}, replays, warmup=3), key=lambda e: e.time_range.start)
    per = len(events) // replays
    names = [e.name for e in events[:per]]
    durations = [[events[r * per + i].time_range.elapsed_us() for r in range(replays)] for i in range(per)]
    walls = [events[r * per + per - 1].time_range.end - events[r * per].time_range.start for r in range(replays)]
    return [(n, statistics.median(d)) for n, d in zip(names, durations)], statistics.median(walls)


def short(name: str) -> str:
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"_\d+$", "", name)
    return name[:70]


def report(title: str, kernels: list[tuple[str, float]], wall: float) -> dict:
    total = sum(d for _, d in kernels)
    print(f"\n## {title}: {len(kernels)} kernels, sum {total:.1f} µs, replay wall {wall:.1f} µs "
          f"(gaps {wall - total:.1f} µs)")
    groups = collections.defaultdict(lambda: [0, 0.0])
    for name, d in kernels:
        groups[short(name)][0] += 1
        groups[short(name)][1] += d
    print(f"{'kernel':72s}{'count':>6s}{'µs':>9s}{'µs each':>9s}")
    for name, (count, d) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:72s}{count:6d}{d:9.1f}{d / count:9.2f}")
    print("\nin order (first 40):")
    for name, d in kernels[:40]:
        print(f"  {d:7.2f}  {name[:110]}")
    print("  ...last 10:")
    for name, d in kernels[-10:]:
        print(f"  {d:7.2f}  {name[:110]}")
    return {"kernels": kernels, "wall_us": wall, "sum_us": total}


def reference(batch: int):
    import vgc
    from vgc.models import llama

    cfg, model, kv = llama_on_cuda("llama_1b")   # bf16
    compiled, _ = warm_llama(model, cfg, kv, vgc.CompilationConfig(cudagraph_mode="full_and_piecewise"))
    inputs = llama.make_batch(cfg, batch, "decode", device="cuda", kv_caches=kv)
    with torch.no_grad():
        compiled(**inputs)
    graphs = compiled.graphs
    size = min(s for s in graphs.full if s >= batch)
    return lambda: graphs.replay_full(size)


def integration(batch: int):
    from vgc.integrations import transformers as vgc_transformers
    from vgc.shells.bench.generate import _build, _shape

    model = _build(_shape("llama_1b", None), "cuda", torch.bfloat16)
    vgc_transformers.compile(model, max_batch_size=batch)
    prompt = torch.randint(1, 1000, (batch, 32), device="cuda")
    with torch.no_grad():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8,
                       do_sample=False)
    step = model.vgc.graph_step(batch)
    graphs = model.vgc.compiled.graphs
    return lambda: graphs.replay_full(step.padded)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}")
    out = {}
    for title, build in (("vgc.compile, vgc's Llama", reference), ("integration, transformers' Llama", integration)):
        replay = build(args.batch)
        with torch.no_grad():
            out[title] = report(title, *replay_kernels(replay))
        torch.compiler.reset()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
