"""`vgc bench decode`: per-step latency of the Llama-3.2-1B-shaped decoder, every execution strategy in one run.

Rows: eager, torch.compile (inductor default), torch.compile mode="reduce-overhead", vgc.compile with
cudagraph_mode NONE / PIECEWISE / FULL / FULL_AND_PIECEWISE and FULL with optional tuning (see `tuned`), and
drop-in torch.compile(backend="vgc") with PIECEWISE / FULL / FULL_AND_PIECEWISE. Columns: decode at several batch
sizes and one prefill size.
Each cell is the median of `--steps` steps timed with CUDA events after `--warmup` untimed steps. With `--passes`,
some vgc rows get a "+ passes" twin (every built-in graph pass on), timed interleaved with the plain row.
With `--tp 1,2`, the tensor-parallel decoder runs one process per GPU instead (`vgc.bench.decode_tp`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _timed_calls(fn, batch: dict, calls: int) -> list[float]:
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
        return statistics.median(_timed_calls(fn, batch, steps))


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
                run(i, lambda: samples[i].extend(_timed_calls(fn, batch, max(1, steps // rounds))))
    return [statistics.median(s) for s in samples], changes


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


def main(argv: list[str] | None = None) -> int:
    import vgc
    from vgc.models import llama

    if argv and any(a == "--tp" or a.startswith("--tp=") for a in argv):   # one process per GPU: its own runner
        from vgc.bench import decode_tp

        return decode_tp.main(argv)

    parser = argparse.ArgumentParser(prog="vgc bench decode")
    parser.add_argument("--batches", default="1,8,64,256", help="decode batch sizes")
    parser.add_argument("--prefill", type=int, default=512, help="prefill tokens (4 sequences)")
    parser.add_argument("--steps", type=int, default=50, help="timed calls per row and size (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before them (default 5)")
    parser.add_argument("--model", choices=["llama_1b", "tiny"], default="llama_1b")
    parser.add_argument("--only", default="", help="comma-separated subset of rows to run")
    parser.add_argument("--passes", action="store_true",
                        help="add a '+ passes' twin of each vgc row, with every built-in graph pass on")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--tp", metavar="SIZES", help="comma-separated tensor-parallel world sizes (e.g. 1,2): "
                        "the sharded decoder, one process per GPU (vgc.bench.decode_tp)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("vgc bench decode needs a CUDA device")

    cfg = llama.llama_1b_config() if args.model == "llama_1b" else llama.tiny_config()
    model = llama.Llama(cfg).cuda().eval()
    kv = llama.make_kv_caches(cfg, "cuda")
    batch_sizes = [int(b) for b in args.batches.split(",")]
    columns = [(f"decode {b}", lambda b=b: llama.make_batch(cfg, b, "decode", device="cuda", kv_caches=kv))
               for b in batch_sizes]
    columns.append((f"prefill {args.prefill}",
                    lambda: llama.make_batch(cfg, args.prefill, "prefill", device="cuda", kv_caches=kv)))

    # Optional tuning: a static artifact for batch 1, where coordinate-descent tuning lets Inductor turn each M=1
    # matmul into a reduction fused with its neighbours (RMSNorm, SiLU, residual adds), and programmatic
    # dependent launch, so that a kernel starts while its predecessor drains. Costs a minute of compile time once.
    tuned = {"compile_sizes": [1], "inductor_compile_config": {"coordinate_descent_tuning": True,
                                                                "triton.enable_pdl": True}}

    def vgc_model(mode: str, **options):
        compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode=mode, **options),
                               pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
        report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                                 make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                               kv_caches=kv))
        graphs = report["cudagraphs"] or {}
        return compiled, {"capture_s": graphs.get("capture_seconds", 0.0),
                          "graphs": graphs.get("piecewise_graphs", 0) + graphs.get("full_graphs", 0)}

    def dropin(mode: str, **options):
        return torch.compile(model, backend="vgc", options={"cudagraph_mode": mode, **options})

    rows = {
        "eager": lambda: (model, {}),
        "inductor default": lambda: (torch.compile(model), {}),
        "inductor reduce-overhead": lambda: (torch.compile(model, mode="reduce-overhead"), {}),
        "vgc NONE": lambda: vgc_model("none"),
        "vgc PIECEWISE": lambda: vgc_model("piecewise"),
        "vgc FULL": lambda: vgc_model("full"),
        "vgc FULL_AND_PIECEWISE": lambda: vgc_model("full_and_piecewise"),
        "vgc FULL tuned": lambda: vgc_model("full", **tuned),
        # Drop-in: graphs are captured on the second call at each shape (the untimed call and warm-up steps).
        "drop-in PIECEWISE": lambda: (dropin("piecewise"), {}),
        "drop-in FULL": lambda: (dropin("full"), {}),
        "drop-in FULL_AND_PIECEWISE": lambda: (dropin("full_and_piecewise"), {}),
    }
    if args.passes:
        from vgc.passes import BUILTIN_PASSES

        on = {"pass_config": {name: True for name in BUILTIN_PASSES}}
        # vgc's Llama already runs q/k/v and gate/up as one matmul each: the twins show the passes cost nothing
        rows = with_pass_twins(rows, {
            "vgc PIECEWISE": lambda: vgc_model("piecewise", **on),
            "vgc FULL": lambda: vgc_model("full", **on),
            "vgc FULL_AND_PIECEWISE": lambda: vgc_model("full_and_piecewise", **on),
            "drop-in PIECEWISE": lambda: (dropin("piecewise", **on), {}),
            "drop-in FULL_AND_PIECEWISE": lambda: (dropin("full_and_piecewise", **on), {})})
    only = [r.strip() for r in args.only.split(",") if r.strip()]
    results = {}
    for group in row_groups(rows, only):
        built = {}
        for name in group:
            start = time.perf_counter()
            built[name] = rows[name]()
            built[name][1]["setup_s"] = time.perf_counter() - start
        cells = {name: {} for name in group}
        for index, (column, make) in enumerate(columns):
            batch = make()
            for name, (fn, extra) in built.items():
                t = time.perf_counter()
                with torch.no_grad():
                    fn(**batch)      # untimed: the inductor rows compile on first use of a shape here
                torch.cuda.synchronize()
                if index == 0:
                    extra["setup_s"] += time.perf_counter() - t
            ms, _ = time_interleaved([fn for fn, _ in built.values()], batch, args.warmup, args.steps)
            for name, value in zip(built, ms):
                cells[name][column] = value
        for name, (_, extra) in built.items():
            results[name] = {"ms": cells[name], **extra}
            print(f"  {name}: " + ", ".join(f"{c} {v:.3f} ms" for c, v in cells[name].items()), flush=True)
        torch.compiler.reset()

    print(f"\nvgc bench decode: {args.model} bf16 on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"median of {args.steps} steps (ms)")
    header = f"{'strategy':26s}" + "".join(f"{c:>14s}" for c, _ in columns) + f"{'setup s':>10s}{'capture s':>11s}"
    print(header)
    for name, r in results.items():
        print(f"{name:26s}" + "".join(f"{r['ms'][c]:14.3f}" for c, _ in columns)
              + f"{r['setup_s']:10.1f}{r.get('capture_s', 0.0):11.1f}")
    base = results.get("inductor reduce-overhead")
    if base:
        print("\nspeed-up over reduce-overhead:")
        for name, r in results.items():
            print(f"{name:26s}" + "".join(f"{base['ms'][c] / r['ms'][c]:13.2f}x" for c, _ in columns))
    print_pass_speedups(results, [c for c, _ in columns], width=26)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
