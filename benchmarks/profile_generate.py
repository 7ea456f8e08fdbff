"""Where a decode step's host time goes under vgc's transformers integration (H200 investigation, not a test).

Builds the Llama-3.2-1B shape (bf16), compiles it with `vgc.integrations.transformers`, and for one batch size
reports: per decode step, host microseconds inside the integration's forward (no sync), inside the graph
dispatcher's replay path, and the GPU time of the step (CUDA events); then a cProfile of one generate().

    PYTHONPATH=. python benchmarks/profile_generate.py --batch 1 --layers 16
"""

import argparse
import collections
import cProfile
import io
import pstats
import statistics
import time

import torch
import transformers

from vgc.shells.bench.generate import _build, _shape
from vgc.integrations import transformers as vgc_transformers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    model = _build(_shape("llama_1b", args.layers), "cuda", torch.bfloat16)
    vgc_transformers.compile(model, max_batch_size=args.batch)
    prompt = torch.randint(1, 1000, (args.batch, 64), device="cuda")
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                  min_new_tokens=args.new_tokens, do_sample=False)
    with torch.no_grad():
        start = time.perf_counter()
        model.generate(prompt, **kwargs)
        print(f"first generate {time.perf_counter() - start:.2f} s")
        engine, dispatcher = model.vgc, model.vgc.compiled.graphs
        host, replay, gpu = [], [], []
        forward, run = model.forward, dispatcher.run

        def timed_forward(*a, **k):
            ids = k.get("input_ids", a[0] if a else None)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            t = time.perf_counter()
            out = forward(*a, **k)
            if ids.shape[1] == 1:
                host.append(time.perf_counter() - t)
                e.record()
                gpu.append((s, e))
            return out

        def timed_run(arguments):
            t = time.perf_counter()
            out = run(arguments)
            replay.append(time.perf_counter() - t)
            return out

        model.forward, dispatcher.run = timed_forward, timed_run
        for _ in range(2):
            start = time.perf_counter()
            model.generate(prompt, **kwargs)
            torch.cuda.synchronize()
            total = time.perf_counter() - start
        torch.cuda.synchronize()
        gpu_ms = [s.elapsed_time(e) for s, e in gpu]
        print(f"batch {args.batch}: generate {1000 * total / args.new_tokens:.3f} ms/token; per decode step: host in "
              f"forward {1e6 * statistics.median(host):.0f} us, of which dispatcher {1e6 * statistics.median(replay):.0f}"
              f" us; forward events {statistics.median(gpu_ms):.3f} ms")
        model.forward, dispatcher.run = forward, run
        kernels_per_step(model, prompt, kwargs, args.new_tokens)
        profile = cProfile.Profile()
        profile.enable()
        model.generate(prompt, **kwargs)
        torch.cuda.synchronize()
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue()[:6000])


def kernels_per_step(model, prompt, kwargs, steps):
    """GPU kernels of one generate(), per decode step: what the forward's graph launches and what it costs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.generate(prompt, **kwargs)
        torch.cuda.synchronize()
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = by_name[event.name[:90]]
            entry[0] += 1
            entry[1] += event.device_time
    total = sum(t for _, t in by_name.values())
    count = sum(n for n, _ in by_name.values())
    print(f"kernels per generate(): {count} ({count / steps:.1f} per token), {total / 1000 / steps:.3f} ms of GPU "
          f"time per token")
    for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]:
        print(f"  {t / 1000 / steps:8.4f} ms/token  {n / steps:6.1f}/token  {name}")


if __name__ == "__main__":
    main()
