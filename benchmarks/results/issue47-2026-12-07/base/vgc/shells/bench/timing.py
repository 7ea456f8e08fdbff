"""What the benchmarks share: timing with CUDA events (alone and interleaved), the device's copy bandwidth, kernels
per call, rows and their '+ passes' twins, the common flags, the reference decoder on CUDA warmed up by vgc."""

from __future__ import annotations

import argparse
import functools
import socket
import statistics
from typing import Sequence

import torch


def timed_calls(fn, batch: dict, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(**batch)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_steps(fn, batch: dict, warmup: int, steps: int) -> float:
    with torch.no_grad():
        for _ in range(warmup):
            fn(**batch)
        torch.cuda.synchronize()
        return statistics.median(timed_calls(fn, batch, steps))


def time_interleaved(fns: list, batch: dict, warmup: int, steps: int, rounds: int = 5,
                     counted: tuple[str, ...] = ()) -> tuple[list[float], list[dict[str, int]]]:
    """Median ms per call of each fn, timed in `rounds` alternating chunks of `steps // rounds` calls, so that
    drift in the host or the GPU (clocks, other work) falls on every fn alike; and per fn, how much each counter
    in `counted` changed during its warm-up and timed calls."""
    import vgc

    samples: list[list[float]] = [[] for _ in fns]
    changes = [dict.fromkeys(counted, 0) for _ in fns]

    def run(i: int, work) -> None:
        with vgc.counters.delta() as d:
            work()
        for name in counted:
            changes[i][name] += d[name]

    with torch.no_grad():
        for i, fn in enumerate(fns):
            run(i, lambda: [fn(**batch) for _ in range(warmup)])
        torch.cuda.synchronize()
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                run(i, lambda: samples[i].extend(timed_calls(fn, batch, max(1, steps // rounds))))
    return [statistics.median(s) for s in samples], changes


def copy_bandwidth_gbs(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """A device-to-device copy's bandwidth (GB/s, bytes read plus bytes written), best of `reps`: the roofline the
    weight bandwidth of a decode step is compared with."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (best * 1e-3) / 1e9


def device_events(fn, batch: dict, calls: int, warmup: int = 1) -> list:
    """The profiler's CUDA events (kernels, memsets, copies; those inside CUDA-graph replays too) of `calls` calls
    of `fn`, after `warmup` untimed ones."""
    from torch.profiler import profile, ProfilerActivity

    for _ in range(warmup):
        fn(**batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(**batch)
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def kernel_profile(fn, batch: dict, calls: int = 5) -> tuple[float, float]:
    """(CUDA kernels, memsets and copies the GPU ran per call of `fn`; the mean idle µs between two consecutive
    ones), from the profiler (CUDA-graph replays included: it sees the kernels inside a graph). Idle stretches
    of 100 µs or more are the host between two calls, not launch gaps, and are left out."""
    with torch.no_grad():
        events = sorted(device_events(fn, batch, calls), key=lambda e: e.time_range.start)
    gaps = [max(0.0, b.time_range.start - a.time_range.end) for a, b in zip(events, events[1:])]
    inside = [gap for gap in gaps if gap < 100]
    return len(events) / calls, (sum(inside) / len(inside) if inside else float("nan"))


PASSES = " + passes"


def with_pass_twins(rows: dict, twins: dict) -> dict:
    """`rows` with each row of `twins` (the same strategy with vgc's graph passes on) right after its plain row."""
    out = {}
    for name, build in rows.items():
        out[name] = build
        if name in twins:
            out[name + PASSES] = twins[name]
    return out


def row_groups(rows: dict, only: list[str]) -> list[list[str]]:
    """The rows to run, each plain row together with its '+ passes' twin (timed interleaved with it)."""
    chosen = [name for name in rows if not only or name in only]
    return [[name] + ([name + PASSES] if name + PASSES in chosen else []) for name in chosen
            if not (name.endswith(PASSES) and name[:-len(PASSES)] in chosen)]


def print_pass_speedups(results: dict, columns: list[str], width: int) -> None:
    """Each '+ passes' row's speed-up over its plain twin, timed interleaved with it in the same run."""
    pairs = [(name, name + PASSES) for name in results if name + PASSES in results]
    if pairs:
        print("\nspeed-up from the graph passes (plain / + passes):")
        for plain, fused in pairs:
            print(f"{plain:{width}s}" + "".join(f"{results[plain]['ms'][c] / results[fused]['ms'][c]:13.2f}x"
                                               for c in columns))


def _row_names(rows: Sequence[str], text: str) -> list[str]:
    """`--only`'s value as row names. A name may hold a comma ("drop-in FULL, one piece"), so at each place the
    longest run of comma-separated pieces that names a row is taken."""
    known = set(rows) | {name + PASSES for name in rows}
    pieces, names, unknown, i = text.split(","), [], [], 0
    while i < len(pieces):
        end = next((j for j in range(len(pieces), i, -1) if ",".join(pieces[i:j]).strip() in known), None)
        if end is None:
            unknown += [pieces[i].strip()] if pieces[i].strip() else []
            i += 1
        else:
            names.append(",".join(pieces[i:end]).strip())
            i = end
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown row(s) {unknown}; the rows are: {', '.join(map(repr, rows))} "
                                         f"(with --passes, also '<row>{PASSES}')")
    return names


def add_row_flags(parser: argparse.ArgumentParser, rows: Sequence[str]) -> None:
    """The flags every row-table benchmark takes: timing, the rows to run (`rows`, the benchmark's row names), pass
    twins, a JSON copy. `args.only` is a list of row names, empty for all."""
    parser.add_argument("--steps", type=int, default=50, help="timed calls per row and column (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before them (default 5)")
    parser.add_argument("--only", default="", type=functools.partial(_row_names, rows), metavar="ROWS",
                        help=f"comma-separated subset of rows to run, of: {', '.join(map(repr, rows))}; with "
                             f"--passes, a vgc row's twin is '<row>{PASSES}' (default: all)")
    parser.add_argument("--passes", action="store_true",
                        help="add a '+ passes' twin of each vgc row, with every built-in graph pass on")
    parser.add_argument("--json", help="also write the results here")


def free_port() -> int:
    """A free TCP port on this host, for a process group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def llama_on_cuda(name: str):
    """(cfg, model, kv caches) of the reference decoder `name` ("llama_1b" or "tiny") on CUDA."""
    from vgc.models import llama

    cfg = llama.llama_1b_config() if name == "llama_1b" else llama.tiny_config()
    return cfg, llama.Llama(cfg).cuda().eval(), llama.make_kv_caches(cfg, "cuda")


def breakable_llama(model, cfg, kv, whole_decode: bool = True, capture_sizes: list[int] | None = None):
    """`vgc.cudagraph.breakable` graphs of the reference decoder over the caches `kv`, captured (no Dynamo, no
    Inductor): attention breaks each size's capture; with `whole_decode`, decode batches get one graph each with
    attention inside (the FULL_AND_PIECEWISE equivalent). (graphs, warmup()'s report)."""
    from vgc.cudagraph import breakable
    from vgc.models import llama

    graphs = breakable(model, dynamic_arg_dims={name: 0 for name in llama.PAD_VALUES}, capture_sizes=capture_sizes,
                       pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode if whole_decode else None)
    report = graphs.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                           make_decode_inputs=(lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                          kv_caches=kv)) if whole_decode else None)
    return graphs, report


def warm_llama(model, cfg, kv, config, record: str | None = None):
    """`vgc.compile` of the reference decoder with `config`, warmed up on prefill batches with FULL graphs on
    decode batches over the caches `kv`; (compiled model, warmup()'s report)."""
    import vgc
    from vgc.models import llama

    compiled = vgc.compile(model, config=config, pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode,
                           record=record)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                           kv_caches=kv))
    return compiled, report
