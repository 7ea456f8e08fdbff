"""`vgc bench decode --traffic FILE`: a mix of decode batch sizes replayed against capture-size choices, in one
run: the default sizes, the sizes a traffic profile chooses, and the default sizes under a memory budget (kept
largest first, or in the profile's value order).

`--traffic generate` draws the mix from a log-normal distribution of batch sizes 1-`--max-batch` (median ~12,
a long tail), and records it the way a deployment would: the default row serves a first stream with
`vgc.compile(..., record=PATH)`, and the profile row starts from that recording. The timed stream is drawn with
another seed. `--traffic FILE` takes a recorded profile instead, and draws both streams from its histogram.
Per row: graphs, graph memory (the pool's growth while capturing), setup seconds, and the mean and p99 step time
over the timed stream (CUDA events; rows interleaved in chunks, so drift falls on all alike).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from collections import Counter

import torch

from vgc.shells.bench.timing import llama_on_cuda, warm_llama


def draw(histogram: dict[int, int], calls: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, weights = zip(*sorted(histogram.items()))
    return rng.choices(sizes, weights, k=calls)


def generated_histogram(max_batch: int, seed: int, calls: int = 20000) -> dict[int, int]:
    rng = random.Random(seed)
    counts: dict[int, int] = {}
    for _ in range(calls):
        n = min(max_batch, max(1, round(rng.lognormvariate(math.log(12), 1.0))))
        counts[n] = counts.get(n, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    import vgc
    from vgc.cudagraph import traffic
    from vgc.models import llama

    parser = argparse.ArgumentParser(prog="vgc bench decode --traffic")
    parser.add_argument("--traffic", required=True, help="a recorded decoder profile, or 'generate'")
    parser.add_argument("--model", choices=["llama_1b", "tiny"], default="llama_1b")
    parser.add_argument("--max-batch", type=int, default=256, help="largest batch of a generated mix")
    parser.add_argument("--calls", type=int, default=3000, help="decode steps in the timed stream")
    parser.add_argument("--record-calls", type=int, default=3000, help="steps recorded by the default row")
    parser.add_argument("--max-graphs", type=int, default=16, help="capture sizes the profile row may choose")
    parser.add_argument("--budget", type=float, default=0.25,
                        help="the budget row's graph memory, as a fraction of the default row's (default 0.25)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("vgc bench decode --traffic needs a CUDA device")

    cfg, model, kv = llama_on_cuda(args.model)
    if args.traffic == "generate":
        source = generated_histogram(args.max_batch, args.seed)
    else:
        source = traffic.decoder_histogram(traffic.load_profile(args.traffic, "decoder"))
    recorded_stream = draw(source, args.record_calls, args.seed + 1)
    timed_stream = draw(source, args.calls, args.seed + 2)
    batches = {n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv)
               for n in sorted(set(recorded_stream) | set(timed_stream))}
    profile_path = os.path.join(tempfile.mkdtemp(prefix="vgc-traffic-"), "decode-traffic.json")

    def build(**options):
        start = time.perf_counter()
        record = options.pop("record", None)
        compiled, report = warm_llama(model, cfg, kv,
                                      vgc.CompilationConfig(cudagraph_mode="full_and_piecewise", **options), record)
        graphs = report["cudagraphs"]
        return compiled, {"setup_s": time.perf_counter() - start, "capture_sizes": graphs["capture_sizes"],
                          "graphs": graphs["piecewise_graphs"] + graphs["full_graphs"],
                          "graph_mib": graphs["graph_memory"]["total_bytes"] / 2 ** 20,
                          "peak_mib": graphs["graph_memory"]["peak_bytes"] / 2 ** 20,
                          "skipped": len(graphs["graph_memory"]["skipped_sizes"])}

    rows = {}
    rows["default sizes"] = build(record=profile_path)
    with torch.no_grad():   # the deployment's first stream, recorded
        for n in recorded_stream:
            rows["default sizes"][0](**batches[n])
    rows["default sizes"][0].recorder.flush()
    profile = traffic.load_profile(profile_path, "decoder")
    rows[f"profile <= {args.max_graphs}"] = build(cudagraph_traffic_profile=profile_path,
                                                  cudagraph_max_graphs=args.max_graphs)
    budget_mib = args.budget * rows["default sizes"][1]["graph_mib"]
    # the default sizes under the budget: by size alone (the largest first), and in the profile's value order
    rows[f"budget {args.budget:.0%}"] = build(cudagraph_memory_budget_mb=budget_mib)
    rows[f"budget {args.budget:.0%} + profile"] = build(
        cudagraph_memory_budget_mb=budget_mib, cudagraph_traffic_profile=profile_path,
        cudagraph_capture_sizes=vgc.CompilationConfig().resolved_capture_sizes())

    samples = {name: [] for name in rows}
    chunk = 100
    with torch.no_grad():
        for name, (fn, _) in rows.items():   # warm every size once, untimed
            for n in batches:
                fn(**batches[n])
        torch.cuda.synchronize()
        for begin in range(0, len(timed_stream), chunk):
            for name, (fn, _) in rows.items():
                for n in timed_stream[begin:begin + chunk]:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn(**batches[n])
                    end.record()
                    end.synchronize()
                    samples[name].append(start.elapsed_time(end))

    recorded = traffic.decoder_histogram(profile)
    print(f"\nvgc bench decode --traffic {args.traffic}: {args.model} bf16 on {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; {len(timed_stream)} decode steps of batch 1-{max(timed_stream)} (median "
          f"{statistics.median(timed_stream)}), profile recorded from {sum(recorded.values())} other steps")
    print(f"{'capture sizes':22s}{'sizes':>7s}{'graphs':>8s}{'graph MiB':>11s}{'peak MiB':>10s}{'setup s':>9s}"
          f"{'mean ms':>9s}{'p99 ms':>8s}{'vs default':>11s}{'padding':>9s}")
    base = statistics.mean(samples["default sizes"])
    results = {}
    for name, (compiled, extra) in rows.items():
        times = sorted(samples[name])
        mean, p99 = statistics.mean(times), times[min(len(times) - 1, int(0.99 * len(times)))]
        padding = traffic.expected_padding(Counter(timed_stream), extra["capture_sizes"]).waste
        results[name] = {**extra, "mean_ms": mean, "p99_ms": p99, "padding": padding}
        print(f"{name:22s}{len(extra['capture_sizes']):7d}{extra['graphs']:8d}{extra['graph_mib']:11.1f}"
              f"{extra['peak_mib']:10.1f}{extra['setup_s']:9.1f}{mean:9.3f}{p99:8.3f}{mean / base:10.3f}x"
              f"{padding:9.1%}")
    for name, r in results.items():
        print(f"  {name}: {r['capture_sizes']}" + (f" ({r['skipped']} skipped for the budget)" if r["skipped"]
                                                     else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "date": time.strftime("%Y-%m-%d"), "traffic": args.traffic, "results": results,
                       "recorded": {str(k): v for k, v in sorted(recorded.items())}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
