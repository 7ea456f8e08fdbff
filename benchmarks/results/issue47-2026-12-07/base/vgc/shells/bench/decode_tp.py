"""`vgc bench decode --tp 1,2`: the decode step of a tensor-parallel Llama, one process per GPU, for each
tensor-parallel size in one run.

Each size starts its ranks (torch.multiprocessing spawn, NCCL on CUDA, gloo with `--device cpu`), every rank builds
its shard of the same weights and runs the same rows: eager, torch.compile reduce-overhead (CUDA) or inductor
default (CPU), and vgc.compile with the chosen cudagraph modes. Rank 0's median step time is reported, with each
row's largest difference from the same row at the smallest tensor-parallel size, and each size's speed-up over it.
`--warm-restart` starts every vgc row once more in fresh processes on the same cache and reports the Inductor calls
each rank made (0 on a warm start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from vgc.shells.bench.timing import free_port, timed_calls

CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def _median_ms(fn, batch: dict, device: torch.device, warmup: int, steps: int) -> float:
    with torch.no_grad():
        for _ in range(warmup):
            fn(**batch)
        if device.type == "cuda":
            return statistics.median(timed_calls(fn, batch, steps))
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            fn(**batch)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _rows(options: dict, device: torch.device) -> list[str]:
    rows = ["eager", "inductor reduce-overhead" if device.type == "cuda" else "inductor default"]
    return rows + [f"vgc {mode.upper()}" for mode in options["modes"]]


def _start_rank(rank: int, tp: int, port: int, options: dict):
    """Join the job and build this rank's shard: (device, shard config, model, KV caches, seconds to build)."""
    from vgc.models import llama

    device = torch.device("cuda", rank) if options["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                         init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp,
                                         timeout=timedelta(seconds=options["timeout_s"]))
    base = {"llama_8b": llama.llama_8b_config, "llama_1b": llama.llama_1b_config,
            "tiny": llama.tiny_config}[options["model"]]()
    cfg = base.sharded(rank, tp)
    if device.type == "cpu":
        cfg.dtype = torch.float32   # gloo sums bf16 on the CPU slowly; fp32 keeps the CPU smoke run honest
    start = time.perf_counter()
    with torch.device(device):
        model = llama.Llama(cfg, tp_group=torch.distributed.group.WORLD if tp > 1 else None).eval()
    return device, cfg, model, llama.make_kv_caches(cfg, device), time.perf_counter() - start


def _vgc_model(model, cfg, kv, device, mode: str, options: dict):
    import vgc
    from vgc.models import llama

    compiled = vgc.compile(model, config=vgc.CompilationConfig(
        cudagraph_mode=mode, cudagraph_capture_sizes=[s for s in CAPTURE_SIZES if s <= max(options["batches"])]),
        pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device=device, kv_caches=kv),
                    make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device=device, kv_caches=kv))
    return compiled


def _time_row(row: str, model, cfg, kv, device, options: dict) -> tuple[dict, torch.Tensor]:
    """Build one row's callable and time it at every batch: ({column: median ms}, its first batch's output)."""
    from vgc.models import llama

    if row == "eager":
        fn = model
    elif row.startswith("inductor"):
        fn = torch.compile(model, mode="reduce-overhead" if "reduce" in row else None)
    else:
        fn = _vgc_model(model, cfg, kv, device, row.split()[1].lower(), options)
    cells, first = {}, None
    for n in options["batches"]:
        step = llama.make_batch(cfg, n, "decode", device=device, kv_caches=kv)
        with torch.no_grad():
            out = fn(**step)   # untimed: torch.compile rows compile this shape here
        if first is None:
            first = out.float().cpu().clone()
        cells[f"decode {n}"] = _median_ms(fn, step, device, options["warmup"], options["steps"])
    return cells, first


def _rank_main(rank: int, tp: int, port: int, options: dict, out_dir: str) -> None:
    import vgc

    device, cfg, model, kv, build_s = _start_rank(rank, tp, port, options)
    results = {"tp": tp, "build_s": build_s, "rows": {}}
    for row in _rows(options, device):
        start = time.perf_counter()
        before = vgc.counters.as_dict()
        try:
            cells, first = _time_row(row, model, cfg, kv, device, options)
        except Exception as e:   # every rank runs the same code, so every rank fails here alike and goes on
            results["rows"][row] = {"error": f"{type(e).__name__}: {e}"[:1000]}
            if rank == 0:
                print(f"  TP={tp} {row}: failed ({results['rows'][row]['error'][:300]})", flush=True)
            torch.compiler.reset()
            continue
        after = vgc.counters.as_dict()
        results["rows"][row] = {"ms": cells, "setup_s": time.perf_counter() - start,
                                "inductor_compiles": after["inductor_compiles"] - before["inductor_compiles"]}
        if rank == 0:
            torch.save(first, os.path.join(out_dir, f"tp{tp}-{row.replace(' ', '_')}.pt"))
            print(f"  TP={tp} {row}: " + ", ".join(f"{c} {v:.3f} ms" for c, v in cells.items()), flush=True)
        torch.compiler.reset()
    if rank == 0:
        Path(out_dir, f"tp{tp}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


def _warm_rank_main(rank: int, tp: int, port: int, options: dict, out_dir: str) -> None:
    """A fresh start of every vgc row on the cache the timed run filled: how many Inductor calls each rank makes."""
    import vgc

    device, cfg, model, kv, _ = _start_rank(rank, tp, port, options)
    report = {}
    for mode in options["modes"]:
        start = time.perf_counter()
        before = vgc.counters.as_dict()
        _vgc_model(model, cfg, kv, device, mode, options)
        after = vgc.counters.as_dict()
        report[f"vgc {mode.upper()}"] = {"inductor_compiles": after["inductor_compiles"] - before["inductor_compiles"],
                                         "dynamo_traces": after["dynamo_traces"] - before["dynamo_traces"],
                                         "warmup_s": time.perf_counter() - start}
    Path(out_dir, f"warm-tp{tp}-rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgc bench decode --tp")
    parser.add_argument("--tp", required=True, help="tensor-parallel sizes, e.g. 1,2 (one process per GPU)")
    parser.add_argument("--model", choices=["llama_8b", "llama_1b", "tiny"], default="llama_8b")
    parser.add_argument("--batches", default="1,64", help="decode batch sizes")
    parser.add_argument("--modes", default="piecewise,full_and_piecewise", help="vgc cudagraph modes (CUDA)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, a smoke run")
    parser.add_argument("--warm-restart", action="store_true", help="start every vgc row again, in new processes")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="process-group timeout per collective")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.tp.split(",")]
    if any(s < 1 for s in sizes):
        raise SystemExit(f"--tp sizes must be positive ints, got {args.tp}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("vgc bench decode --tp needs CUDA devices (or --device cpu for a gloo smoke run)")
        if max(sizes) > torch.cuda.device_count():
            raise SystemExit(f"--tp {max(sizes)} needs {max(sizes)} GPUs; this machine has "
                             f"{torch.cuda.device_count()}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.device == "cpu":
        modes = ["none"]
    options = {"model": args.model, "batches": [int(b) for b in args.batches.split(",")], "modes": modes,
               "steps": args.steps, "warmup": args.warmup, "device": args.device, "timeout_s": args.timeout_s}
    out_dir = tempfile.mkdtemp(prefix="vgc-bench-tp-")
    os.environ.setdefault("VGC_CACHE_ROOT", os.path.join(out_dir, "cache"))   # cold unless the user says otherwise
    results, warm = {}, {}
    for tp in sizes:
        torch.multiprocessing.spawn(_rank_main, args=(tp, free_port(), options, out_dir), nprocs=tp, join=True)
        results[tp] = json.loads(Path(out_dir, f"tp{tp}.json").read_text())
        if args.warm_restart:
            torch.multiprocessing.spawn(_warm_rank_main, args=(tp, free_port(), options, out_dir), nprocs=tp,
                                        join=True)
            warm[tp] = [json.loads(Path(out_dir, f"warm-tp{tp}-rank{r}.json").read_text()) for r in range(tp)]
    _add_differences(results, sizes, out_dir)
    _print(results, warm, options, sizes)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "steps": args.steps,
            "results": {str(tp): r for tp, r in results.items()},
            "warm_restart": {str(tp): w for tp, w in warm.items()}}, indent=1))
    return 0


def _add_differences(results: dict, sizes: list[int], out_dir: str) -> None:
    """Each row's `max_diff`: the largest difference of its first batch's output (rank 0) from the same row's at the
    smallest tensor-parallel size."""
    base = sizes[0]
    for tp in sizes[1:]:
        for row, result in results[tp]["rows"].items():
            name = row.replace(" ", "_")
            mine, theirs = Path(out_dir, f"tp{tp}-{name}.pt"), Path(out_dir, f"tp{base}-{name}.pt")
            if mine.exists() and theirs.exists():
                result["max_diff"] = (torch.load(mine) - torch.load(theirs)).abs().max().item()


def _print(results: dict, warm: dict, options: dict, sizes: list[int]) -> None:
    columns = [f"decode {n}" for n in options["batches"]]
    rows = list(results[sizes[0]]["rows"])
    width = 28
    print(f"\nvgc bench decode --tp: {options['model']} on {options['device']}, torch {torch.__version__}; "
          f"median of {options['steps']} steps (ms, rank 0)")
    print(f"{'strategy':{width}s}" + "".join(f"{f'TP={tp} ' + c:>18s}" for tp in sizes for c in columns))

    def cell(tp: int, row: str, column: str) -> float | None:
        return results[tp]["rows"][row].get("ms", {}).get(column)

    for row in rows:
        print(f"{row:{width}s}" + "".join(f"{cell(tp, row, c):18.3f}" if cell(tp, row, c) is not None
                                          else f"{'failed':>18s}" for tp in sizes for c in columns))
    base = sizes[0]
    for tp in sizes[1:]:
        print(f"\nspeed-up of TP={tp} over TP={base}, and largest difference of its decode {options['batches'][0]} "
              f"output from TP={base}'s:")
        for row in rows:
            if any(cell(size, row, c) is None for size in (base, tp) for c in columns):
                error = results[tp]["rows"][row].get("error") or results[base]["rows"][row].get("error")
                print(f"{row:{width}s}   failed: {error}")
                continue
            speed = "".join(f"{cell(base, row, c) / cell(tp, row, c):13.2f}x" for c in columns)
            print(f"{row:{width}s}{speed}   max diff {results[tp]['rows'][row]['max_diff']:.4f}")
    for tp, ranks in warm.items():
        print(f"\nwarm restart at TP={tp} (Inductor calls / Dynamo traces / warmup s per rank):")
        for row in ranks[0]:
            print(f"{row:{width}s}" + "".join(f"   rank {r}: {w[row]['inductor_compiles']} / {w[row]['dynamo_traces']}"
                                              f" / {w[row]['warmup_s']:.1f}" for r, w in enumerate(ranks)))
