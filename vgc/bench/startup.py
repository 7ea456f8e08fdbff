"""`vgc bench startup`: cold vs warm time to first output, each in a fresh process.

Cold: an empty cache root (and Inductor cache under it). Warm: the same root again, so every artifact loads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _child(model_name: str, device: str, spawned_at: float) -> None:
    import torch

    import vgc
    from vgc.models import llama

    # Wall-clock from the parent's spawn: interpreter start and `import torch` count too.
    t_import = time.time() - spawned_at
    cfg = llama.tiny_config() if model_name == "tiny" else llama.llama_1b_config()
    start = time.perf_counter()
    model = llama.Llama(cfg).to(device)
    t_model = time.perf_counter() - start
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="none"))
    start = time.perf_counter()
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device=device))
    with torch.no_grad():
        out = compiled(**llama.make_batch(cfg, 8, "decode", device=device))
    if device == "cuda":
        torch.cuda.synchronize()
    t_compile = time.perf_counter() - start
    graph = compiled.backend.graphs[0]
    print(json.dumps({
        "import_s": t_import, "model_s": t_model, "warmup_s": t_compile,
        "first_output_s": time.time() - spawned_at,
        "trace_s": report["seconds"]["dynamo_trace_and_run"],
        "compile_or_load_s": graph.seconds["compile"], "cache_key_s": graph.seconds["cache_key"],
        "inductor_compiles": vgc.counters.inductor_compiles, "artifacts_loaded": vgc.counters.artifacts_loaded,
        "finite": bool(torch.isfinite(out).all()),
    }))


def _run_child(model_name: str, device: str, root: str) -> dict:
    env = dict(os.environ, VGC_CACHE_ROOT=root)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # cold means cold: Inductor's kernels live under the root too
    proc = subprocess.run([sys.executable, "-m", "vgc.bench.startup", "--child", model_name, device,
                           repr(time.time())], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"startup child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="vgc bench startup")
    parser.add_argument("--model", choices=["tiny", "llama_1b"], default=None,
                        help="default: llama_1b on CUDA, tiny on CPU")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--warm-runs", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_name = args.model or ("llama_1b" if device == "cuda" else "tiny")
    root = tempfile.mkdtemp(prefix="vgc-bench-startup-")
    cold = _run_child(model_name, device, root)
    warms = [_run_child(model_name, device, root) for _ in range(args.warm_runs)]
    warm = min(warms, key=lambda r: r["first_output_s"])
    rows = [("cold", cold), ("warm (best of %d)" % len(warms), warm)]
    print(f"vgc bench startup: {model_name} on {device}, torch {torch.__version__}")
    print(f"{'run':18s} {'first output':>12s} {'import':>8s} {'model':>8s} {'warmup':>8s} {'trace':>8s} "
          f"{'compile/load':>12s} {'Inductor':>9s} {'loaded':>7s}")
    for name, r in rows:
        print(f"{name:18s} {r['first_output_s']:11.2f}s {r['import_s']:7.2f}s {r['model_s']:7.2f}s "
              f"{r['warmup_s']:7.2f}s {r['trace_s']:7.2f}s {r['compile_or_load_s']:11.2f}s "
              f"{r['inductor_compiles']:9d} {r['artifacts_loaded']:7d}")
    print(f"warm/cold: warm-up phase {warm['warmup_s'] / cold['warmup_s']:.1%}, "
          f"whole process {warm['first_output_s'] / cold['first_output_s']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model_name, "device": device, "torch": torch.__version__, "cold": cold,
                       "warm": warms}, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        raise SystemExit(main())
