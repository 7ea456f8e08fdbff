"""`vgc bench decode`: per-step latency of the Llama-3.2-1B-shaped decoder, every execution strategy in one run.

Rows: eager, torch.compile (inductor default), torch.compile mode="reduce-overhead", vgc.compile with
cudagraph_mode NONE / PIECEWISE / FULL / FULL_AND_PIECEWISE, FULL_AND_PIECEWISE's twins (cuBLAS matmuls,
Inductor's kernels chained by PDL, tuning scoped to a static batch-1 artifact, eager pieces:
no Inductor), breakable graphs (`vgc.cudagraph.breakable`: no Dynamo, no Inductor; with or without whole graphs
for decode batches) and drop-in torch.compile(backend="vgc") with PIECEWISE / FULL / FULL_AND_PIECEWISE. Columns: decode at several batch
sizes and one prefill size.
Each cell is the median of `--steps` steps timed with CUDA events after `--warmup` untimed steps. With `--passes`,
some vgc rows get a "+ passes" twin (every built-in graph pass on), timed interleaved with the plain row; with
`--interleave`, every chosen row is built first and all are timed interleaved.

Beside the times: the roofline (the weights' bytes over the step time, and that as a share of a device-to-device
copy's bandwidth measured in the same run), the CUDA kernels per step of the graph rows and the mean idle time
between two of a step's kernels (profiler: what launch latency costs inside a graph), and per row
the setup seconds (compile + capture; cold only for the first row of a process with empty caches) and the Inductor
compiles it made.
With `--tp 1,2`, the tensor-parallel decoder runs one process per GPU instead (`vgc.shells.bench.decode_tp`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vgc.shells.bench.timing import (add_row_flags, breakable_llama, copy_bandwidth_gbs, kernel_profile, llama_on_cuda,
                              print_pass_speedups, row_groups, time_interleaved, warm_llama, with_pass_twins)


ROWS = ("eager", "inductor default", "inductor reduce-overhead", "vgc NONE", "vgc PIECEWISE", "vgc FULL",
        "vgc FULL_AND_PIECEWISE", "vgc F&P cuBLAS", "vgc F&P unfused", "vgc F&P + fused RoPE",
        "vgc F&P + Inductor PDL", "vgc F&P tuned [1]", "vgc F&P eager pieces", "breakable + whole decode", "breakable",
        "drop-in PIECEWISE", "drop-in FULL", "drop-in FULL_AND_PIECEWISE")
"""The rows main() builds, in order: what --only accepts, known before a model is built."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgc bench decode",
        description="Per-step latency of a Llama-3.2-1B-shaped decoder under every execution strategy (eager, "
                    "torch.compile, vgc.compile in each cudagraph mode, breakable graphs, drop-in "
                    "torch.compile(backend=\"vgc\")), at several decode batch sizes and one prefill size. Needs CUDA.")
    parser.add_argument("--batches", default="1,8,64,256", help="decode batch sizes, comma-separated "
                                                                "(default: %(default)s)")
    parser.add_argument("--prefill", type=int, default=512, help="prefill tokens, in 4 sequences "
                                                                 "(default: %(default)s)")
    parser.add_argument("--model", choices=["llama_1b", "tiny"], default="llama_1b",
                        help="the decoder's shape: llama_1b (Llama-3.2-1B) or tiny (default: %(default)s)")
    add_row_flags(parser, ROWS)
    parser.add_argument("--interleave", action="store_true",
                        help="build every chosen row first, then time all of them interleaved (more memory)")
    parser.add_argument("--no-kernel-count", action="store_true",
                        help="skip the profiler's kernel count of the graph rows (counted after all timing, when "
                             "the rows run as one group: --interleave, or a single row)")
    parser.add_argument("--tp", metavar="SIZES", help="comma-separated tensor-parallel world sizes (e.g. 1,2): "
                        "the sharded decoder, one process per GPU (vgc.shells.bench.decode_tp)")
    parser.add_argument("--traffic", metavar="FILE", help="a recorded decoder traffic profile, or 'generate': "
                        "replay a mix of batch sizes against default, profile-chosen and memory-budgeted capture "
                        "sizes (vgc.shells.bench.decode_traffic; see its --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import vgc
    from vgc.models import llama

    if argv and any(a == "--tp" or a.startswith("--tp=") for a in argv):   # one process per GPU: its own runner
        from vgc.shells.bench import decode_tp

        return decode_tp.main(argv)
    if argv and any(a == "--traffic" or a.startswith("--traffic=") for a in argv):   # a mix of batch sizes
        from vgc.shells.bench import decode_traffic

        return decode_traffic.main(argv)

    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("vgc bench decode needs a CUDA device")

    cfg, model, kv = llama_on_cuda(args.model)
    batch_sizes = [int(b) for b in args.batches.split(",")]
    columns = [(f"decode {b}", lambda b=b: llama.make_batch(cfg, b, "decode", device="cuda", kv_caches=kv))
               for b in batch_sizes]
    columns.append((f"prefill {args.prefill}",
                    lambda: llama.make_batch(cfg, args.prefill, "prefill", device="cuda", kv_caches=kv)))

    weight_bytes = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "embed" not in name)
    copy_gbs = copy_bandwidth_gbs()

    # Optional tuning, scoped to a static artifact for batch 1: coordinate-descent tuning lets Inductor turn each
    # M=1 matmul into a reduction fused with its neighbours (RMSNorm, SiLU, residual adds), and programmatic
    # dependent launch lets a kernel start while its predecessor drains. Costs a minute of compile time once.
    tuned = {"compile_sizes": [1], "compile_sizes_inductor_config": {"coordinate_descent_tuning": True,
                                                                      "triton.enable_pdl": True}}

    def vgc_model(mode: str, **options):
        compiled, report = warm_llama(model, cfg, kv, vgc.CompilationConfig(cudagraph_mode=mode, **options))
        graphs = report["cudagraphs"] or {}
        return compiled, {"capture_s": graphs.get("capture_seconds", 0.0),
                          "graphs": graphs.get("piecewise_graphs", 0) + graphs.get("full_graphs", 0)}

    def breakable_model(whole_decode: bool):
        graphs, report = breakable_llama(model, cfg, kv, whole_decode)
        return graphs, {"capture_s": report["seconds"]["capture"],
                        "graphs": sum(report["segments"].values()) + len(report["whole_graph_sizes"])}

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
        # What each default of FULL_AND_PIECEWISE buys, and the candidates that are not defaults
        # The defaults before issue 47 (cuBLAS matmuls) and before its fusion (vgc's GEMVs alone); Inductor's kernels
        # chained to vgc's by PDL (opt-in)
        "vgc F&P cuBLAS": lambda: vgc_model("full_and_piecewise", pass_config={"skinny_matmuls": False}),
        "vgc F&P unfused": lambda: vgc_model("full_and_piecewise", pass_config={"skinny_matmul_fusion": False}),
        "vgc F&P + fused RoPE": lambda: vgc_model("full_and_piecewise", pass_config={"skinny_matmul_rope": True}),
        "vgc F&P + Inductor PDL": lambda: vgc_model("full_and_piecewise",
                                                    inductor_compile_config={"triton.enable_pdl": True}),
        "vgc F&P tuned [1]": lambda: vgc_model("full_and_piecewise", **tuned),
        # Without Inductor: the pieces run their own graphs; or no Dynamo either, the eager forward captured in
        # segments between attention calls (whole graphs for decode batches, or attention eager there too)
        "vgc F&P eager pieces": lambda: vgc_model("full_and_piecewise", piece_backend="eager"),
        "breakable + whole decode": lambda: breakable_model(True),
        "breakable": lambda: breakable_model(False),
        # Drop-in: graphs are captured on the second call at each shape (the untimed call and warm-up steps).
        "drop-in PIECEWISE": lambda: (dropin("piecewise"), {}),
        "drop-in FULL": lambda: (dropin("full"), {}),
        "drop-in FULL_AND_PIECEWISE": lambda: (dropin("full_and_piecewise"), {}),
    }
    assert tuple(rows) == ROWS, "ROWS (what --only accepts) must name the rows built here, in order"
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
    results = {}
    groups = row_groups(rows, args.only)
    if args.interleave:
        groups = [[name for group in groups for name in group]]
    for group in groups:
        built = {}
        for name in group:
            start = time.perf_counter()
            with vgc.counters.delta() as made:
                built[name] = rows[name]()
            built[name][1]["setup_s"] = time.perf_counter() - start
            built[name][1]["inductor_compiles"] = made["inductor_compiles"]
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
            print(f"  {column}: " + ", ".join(f"{name} {value:.3f}" for name, value in zip(built, ms)), flush=True)
        if not args.no_kernel_count and len(groups) == 1:
            # After every timing (so only with one group): once the profiler has run, launches in this process cost
            # more host time (on the H200, prefill 512 took 2x as long after a profiled column as in a clean process)
            for column, make in columns:
                batch = make()
                for name, (fn, extra) in built.items():
                    if "vgc" in name and "NONE" not in name or "reduce-overhead" in name or "breakable" in name:
                        kernels, gap = kernel_profile(fn, batch)
                        extra.setdefault("kernels", {})[column] = kernels
                        extra.setdefault("gap_us", {})[column] = gap
        for name, (_, extra) in built.items():
            results[name] = {"ms": cells[name], **extra}
            print(f"  {name}: " + ", ".join(f"{c} {v:.3f} ms" for c, v in cells[name].items()), flush=True)
        torch.compiler.reset()

    print(f"\nvgc bench decode: {args.model} bf16 on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"median of {args.steps} steps (ms)")
    header = f"{'strategy':26s}" + "".join(f"{c:>14s}" for c, _ in columns) + \
        f"{'setup s':>10s}{'capture s':>11s}{'compiles':>10s}"
    print(header)
    for name, r in results.items():
        print(f"{name:26s}" + "".join(f"{r['ms'][c]:14.3f}" for c, _ in columns)
              + f"{r['setup_s']:10.1f}{r.get('capture_s', 0.0):11.1f}"
              + (f"{r['inductor_compiles']:10d}" if name.startswith(("vgc", "breakable")) else f"{'-':>10s}"))
    print(f"\nroofline: {weight_bytes / 1e9:.2f} GB of weights per step; a device-to-device copy moves "
          f"{copy_gbs:.0f} GB/s here (floor {weight_bytes / copy_gbs / 1e6:.3f} ms). Weight GB/s (share of copy):")
    for name, r in results.items():
        gbs = [weight_bytes / r["ms"][c] / 1e6 for c, _ in columns]
        print(f"{name:26s}" + "".join(f"{g:8.0f} ({g / copy_gbs:3.0%})" for g in gbs))
    counted = {name: r["kernels"] for name, r in results.items() if r.get("kernels")}
    if counted:
        print("\nGPU kernels per call (profiler):")
        for name, kernels in counted.items():
            print(f"{name:26s}" + "".join(f"{kernels.get(c, float('nan')):14.0f}" for c, _ in columns))
        print("\nmean launch gap between two kernels of a call, µs (profiler; the idle time a chained launch hides):")
        for name in counted:
            gaps = results[name].get("gap_us", {})
            print(f"{name:26s}" + "".join(f"{gaps.get(c, float('nan')):14.2f}" for c, _ in columns))
    base = results.get("inductor reduce-overhead")
    if base:
        print("\nspeed-up over reduce-overhead:")
        for name, r in results.items():
            print(f"{name:26s}" + "".join(f"{base['ms'][c] / r['ms'][c]:13.2f}x" for c, _ in columns))
    print_pass_speedups(results, [c for c, _ in columns], width=26)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "weight_bytes": weight_bytes,
                       "copy_gbs": copy_gbs, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
