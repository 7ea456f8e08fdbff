"""`vgc bench startup`: cold vs warm start of `vgc.compile`, each in a fresh process, phase by phase.

Cold: every compile cache the process touches starts empty in a new directory: vgc's root, Inductor's cache (under
the root), Triton's (`TRITON_CACHE_DIR`) and CUDA's PTX cache (`CUDA_CACHE_PATH`). Warm: the same directories
again, so the saved trace and every artifact load. Bundle: what a deployment sees, the root packed into one file
(`vgc cache pack`), unpacked under a new root, and a process started there with every other cache empty. The table
prints each phase, counts Dynamo traces and Inductor calls, and says whether the process imported Inductor's
compiler (a warm start need not: `VGC_LOAD_WITHOUT_COMPILER=0` for torch's ordinary load); "after build" is the
first output less the import and the model's construction, what vgc adds to a start. `--strategy eager-pieces`
starts `vgc.compile` with `piece_backend="eager"`; `--strategy breakable` captures `vgc.cudagraph.breakable`
graphs (nothing to trace, compile or cache: every start is its warm-up's capture); `--strategy tiered` starts
`vgc.compile(..., tiered=True)` and serves decode calls until the compiled model is swapped in: "full speed" is
when the first compiled call ends.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = ("none", "piecewise", "full", "full_and_piecewise")
STRATEGIES = ("inductor", "eager-pieces", "breakable", "tiered")


def _child(model_name: str, device: str, mode: str, strategy: str, spawned_at: float) -> None:
    import torch

    import vgc
    from vgc import _compat
    from vgc.models import llama

    # Wall-clock from the parent's spawn: interpreter start and `import torch` count too.
    t_import = time.time() - spawned_at
    cfg = llama.tiny_config() if model_name == "tiny" else llama.llama_1b_config()
    start = time.perf_counter()
    model = llama.Llama(cfg).to(device)
    if device == "cuda":
        torch.cuda.synchronize()
    t_model = time.perf_counter() - start
    kv = llama.make_kv_caches(cfg, device=device)   # graphs replay on caches that stay put
    if strategy == "breakable":   # no Dynamo, no Inductor: warmup() is the capture
        from vgc.shells.bench.timing import breakable_llama

        compiled, report = breakable_llama(model, cfg, kv, whole_decode=mode in ("full", "full_and_piecewise"))
        report["seconds"] = {"warmup": report["seconds"]["capture"], "cudagraph_capture": report["seconds"]["capture"]}
    else:
        config = vgc.CompilationConfig(cudagraph_mode=mode, piece_backend="eager" if strategy == "eager-pieces"
                                       else "inductor")
        compiled = vgc.compile(model, config=config, pad_values=llama.PAD_VALUES,
                               uniform_decode=llama.is_uniform_decode, tiered=strategy == "tiered")
        start = time.perf_counter()
        report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device=device, kv_caches=kv),
                                 make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device=device,
                                                                               kv_caches=kv))
        report["seconds"]["warmup"] = time.perf_counter() - start   # a tiered start's warmup() returns at once
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(**llama.make_batch(cfg, 8, "decode", device=device, kv_caches=kv))
    if device == "cuda":
        torch.cuda.synchronize()
    first_output_s, decode_call_s = time.time() - spawned_at, time.perf_counter() - start
    full_speed_s, first_tier_calls, background_phases = time.time() - spawned_at, {}, {}
    if strategy == "tiered":   # serve decode calls until the compiled model is swapped in (or its compile failed)
        batch = llama.make_batch(cfg, 8, "decode", device=device, kv_caches=kv)
        with torch.no_grad():
            while compiled.background_compile == "running":
                compiled(**batch)
            compiled(**batch)
        if device == "cuda":
            torch.cuda.synchronize()
        stats = compiled.stats()
        full_speed_s, first_tier_calls = time.time() - spawned_at, stats["tier_calls"]
        background_phases = stats["background_seconds"]
        report["seconds"].update({k: v for k, v in stats["seconds"].items() if k != "warmup"})
    seconds = report["seconds"]
    counts = vgc.counters
    print(json.dumps({
        "import_s": t_import, "model_s": t_model, "warmup_s": seconds["warmup"],
        "trace_s": seconds.get("trace", 0.0) + seconds.get("trace_and_compile", 0.0),
        "load_trace_s": seconds.get("load_trace", 0.0),
        "compile_s": seconds.get("compile_or_load", 0.0), "load_artifacts_s": seconds.get("load_artifacts", 0.0),
        "save_trace_s": seconds.get("save_trace", 0.0), "capture_s": seconds.get("cudagraph_capture", 0.0),
        "first_output_s": first_output_s, "decode_call_s": decode_call_s, "full_speed_s": full_speed_s,
        "eager_calls": first_tier_calls.get("eager", 0), "graph_calls": first_tier_calls.get("graphs", 0),
        "tier": getattr(compiled, "tier", None),
        "background_compile_s": seconds.get("background_compile", 0.0), "swap_s": seconds.get("swap", 0.0),
        "background_phases_s": background_phases,
        "trace_source": getattr(compiled, "trace_source", "none"), "dynamo_traces": counts.dynamo_traces,
        "inductor_compiles": counts.inductor_compiles, "artifacts_loaded": counts.artifacts_loaded,
        "traces_loaded": counts.traces_loaded, "finite": bool(torch.isfinite(out).all()),
        "compiler_imported": bool(_compat.compiler_modules_imported()),
    }))


def _bytecode_state(source: str) -> str:
    """Whether the processes import torch from bytecode: without it every import compiles torch's sources (seconds
    of each start, more than a warm `warmup()` on a GPU host)."""
    cached = importlib.util.cache_from_source(source)
    if os.path.exists(cached):
        return f"cached ({cached})"
    if sys.dont_write_bytecode:
        return ("not cached and not written (PYTHONDONTWRITEBYTECODE): every process compiles the source of the "
                "torch modules it imports; an installed torch has its .pyc files")
    return f"not cached yet: the first process writes it ({cached})"


def cache_dirs(root: str) -> dict[str, str]:
    """The compile caches a start touches, all under `root`, as environment variables."""
    return {"VGC_CACHE_ROOT": os.path.join(root, "vgc"), "TRITON_CACHE_DIR": os.path.join(root, "triton"),
            "CUDA_CACHE_PATH": os.path.join(root, "cuda")}


def _run_child(model_name: str, device: str, mode: str, root: str, strategy: str = "inductor") -> dict:
    env = dict(os.environ, **cache_dirs(root))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)   # Inductor's cache then lives under the vgc root
    proc = subprocess.run([sys.executable, "-m", "vgc.shells.bench.startup", "--child", model_name, device, mode,
                           strategy, repr(time.time())], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"startup child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


COLUMNS = [("first output", "first_output_s"), ("import", "import_s"), ("model", "model_s"),
           ("warmup()", "warmup_s"), ("trace", "trace_s"), ("load trace", "load_trace_s"),
           ("compile", "compile_s"), ("load artifacts", "load_artifacts_s"), ("capture", "capture_s")]


TIERED_COLUMNS = [("full speed", "full_speed_s"), ("background", "background_compile_s"), ("swap", "swap_s")]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgc bench startup",
        description="Time to first output of vgc.compile, phase by phase, each start in a fresh process: cold (every "
                    "compile cache empty), warm (the same caches again) and from a bundle (the warm cache packed, then "
                    "unpacked under a new root).")
    parser.add_argument("--model", choices=["tiny", "llama_1b"], default=None,
                        help="the Llama shape to start (default: llama_1b on CUDA, tiny on the CPU)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where the model runs (default: cuda when available, else cpu)")
    parser.add_argument("--cudagraph-mode", choices=MODES, default="none",
                        help="capture CUDA graphs in warmup() too, CUDA only (default: %(default)s)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="inductor",
                        help="vgc.compile with Inductor pieces (inductor) or eager pieces (eager-pieces: "
                             "piece_backend='eager'), or breakable graphs (breakable: vgc.cudagraph.breakable, no "
                             "Dynamo, no Inductor, nothing cached; needs CUDA and a cudagraph mode), or a tiered "
                             "start (tiered: vgc.compile(..., tiered=True): the model itself serves while a child "
                             "process compiles, then the compiled model is swapped in) (default: %(default)s)")
    parser.add_argument("--warm-runs", type=int, default=2, help="warm starts after the cold one, 0 for the cold "
                        "start only (default: %(default)s)")
    parser.add_argument("--no-bundle", action="store_true", help="skip the bundle row (pack, unpack, start)")
    parser.add_argument("--generate", type=float, metavar="SECONDS",
                        help="instead: the first SECONDS of a transformers causal LM's generate() loop in fresh "
                             "processes, transformers' compiled path against vgc's integration, plain and tiered "
                             "(`vgc bench generate`'s shapes; default: off)")
    parser.add_argument("--json", help="also write the results to this file (default: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warm_runs < 0:
        parser.error(f"--warm-runs must be 0 or more, got {args.warm_runs}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_name = args.model or ("llama_1b" if device == "cuda" else "tiny")
    if args.generate is not None:
        return _first_seconds(args, model_name, device)
    root = tempfile.mkdtemp(prefix="vgc-bench-startup-")
    if args.strategy == "breakable" and (device != "cuda" or args.cudagraph_mode == "none"):
        raise SystemExit("--strategy breakable captures CUDA graphs: it needs --device cuda and --cudagraph-mode "
                         "piecewise (attention eager everywhere) or full_and_piecewise (whole decode graphs)")
    print(f"vgc bench startup: {model_name} on {device}, torch {torch.__version__}, cudagraph_mode "
          f"{args.cudagraph_mode}, strategy {args.strategy}; every cache starts empty in:")
    for name, path in cache_dirs(root).items():
        print(f"  {name}={path}")
    print(f"  torch's bytecode: {_bytecode_state(torch.__file__)}")
    print(f"  TORCHINDUCTOR_CACHE_DIR={os.path.join(cache_dirs(root)['VGC_CACHE_ROOT'], 'inductor_cache')}")
    cold = _run_child(model_name, device, args.cudagraph_mode, root, args.strategy)
    warms = [_run_child(model_name, device, args.cudagraph_mode, root, args.strategy) for _ in range(args.warm_runs)]
    warm = min(warms, key=lambda r: r["warmup_s"]) if warms else None
    rows = [("cold", cold)] + [(f"warm {i + 1}", r) for i, r in enumerate(warms)]
    deployment = None if args.no_bundle or args.strategy == "breakable" or warm is None else \
        _deploy(model_name, device, args.cudagraph_mode, root, args.strategy)
    if deployment is not None:
        rows.append(("bundle", deployment["run"]))
    columns = COLUMNS + (TIERED_COLUMNS if args.strategy == "tiered" else [])
    print(f"{'run':8s}" + "".join(f"{title:>15s}" for title, _ in columns)
          + f"{'after build':>15s}{'Dynamo traces':>15s}{'Inductor calls':>15s}{'loaded':>8s}{'compiler':>10s}"
          + (f"{'eager calls':>12s}{'graph calls':>12s}" if args.strategy == "tiered" else ""))
    for name, r in rows:
        after_build = r["first_output_s"] - r["import_s"] - r["model_s"]
        print(f"{name:8s}" + "".join(f"{r[key]:14.2f}s" for _, key in columns) + f"{after_build:14.2f}s"
              + f"{r['dynamo_traces']:15d}{r['inductor_compiles']:15d}{r['artifacts_loaded']:8d}"
              + f"{'imported' if r.get('compiler_imported') else 'no':>10s}"
              + (f"{r['eager_calls']:12d}{r['graph_calls']:12d}" if args.strategy == "tiered" else ""))
    if args.strategy == "tiered":
        print("tiered: the first output comes from the model itself (with a graph mode, later calls replay its "
              "breakable graphs, each padded size captured on demand: graph calls); full speed is the end of the "
              "first call served compiled, after the background compile (a child process; its Dynamo and Inductor "
              "work is not in this process's counts) and the swap (load and capture in the serving process)")
        for name, r in rows:
            if r.get("background_phases_s"):
                print(f"{name} background compile: " + ", ".join(
                    f"{phase} {seconds:.2f} s" for phase, seconds in r["background_phases_s"].items()))
    if deployment is not None:
        print(f"bundle: {deployment['mib']:.1f} MiB, packed in {deployment['pack_s']:.2f} s, unpacked under a new "
              f"root in {deployment['unpack_s']:.2f} s")
    no_capture = lambda r: r["warmup_s"] - r["capture_s"]  # noqa: E731
    if warm is not None and no_capture(cold) > 0 and args.strategy != "tiered":   # breakable: all capture
        first_output = warm["first_output_s"] / cold["first_output_s"]
        print(f"best warm / cold: warmup() without capture {no_capture(warm):.2f} s / {no_capture(cold):.2f} s = "
              f"{no_capture(warm) / no_capture(cold):.1%}; first output {first_output:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model_name, "device": device, "torch": torch.__version__,
                       "cudagraph_mode": args.cudagraph_mode, "strategy": args.strategy, "cold": cold, "warm": warms,
                       "bundle": deployment}, f, indent=1)
    return 0


def _first_seconds(args, model_name: str, device: str) -> int:
    from vgc.shells.bench import first_minute

    if args.generate <= 0:
        raise SystemExit(f"--generate must be a positive number of seconds, got {args.generate:g}")
    env = {}
    for row in first_minute.ROWS:   # every row starts with every cache empty
        dirs = cache_dirs(tempfile.mkdtemp(prefix="vgc-bench-first-seconds-"))
        env[row] = {k: v for k, v in {**os.environ, **dirs}.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    print(f"vgc bench startup --generate {args.generate:g}: {model_name} on {device}, batch 1, "
          f"{first_minute.PROMPT}-token prompt, {first_minute.NEW_TOKENS} new tokens per generate(); each row a fresh "
          "process with empty caches")
    results = first_minute.run(model_name, device, args.generate, env)
    first_minute.report(results, args.generate)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model_name, "device": device, "seconds": args.generate, "rows": results}, f,
                      indent=1)
    return 0


def _deploy(model_name: str, device: str, mode: str, root: str, strategy: str) -> dict:
    """Pack the warm root, unpack it under a new root whose other caches are empty, start a process there."""
    from vgc.shells import bundle

    path = os.path.join(root, "deployment.vgcb")
    start = time.perf_counter()
    bundle.pack(cache_dirs(root)["VGC_CACHE_ROOT"], path)
    pack_s = time.perf_counter() - start
    target = tempfile.mkdtemp(prefix="vgc-bench-deployment-")
    start = time.perf_counter()
    bundle.unpack(path, cache_dirs(target)["VGC_CACHE_ROOT"])
    unpack_s = time.perf_counter() - start
    return {"pack_s": pack_s, "unpack_s": unpack_s, "mib": os.path.getsize(path) / 2 ** 20,
            "run": _run_child(model_name, device, mode, target, strategy)}


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], float(sys.argv[6]))
    else:
        raise SystemExit(main())
