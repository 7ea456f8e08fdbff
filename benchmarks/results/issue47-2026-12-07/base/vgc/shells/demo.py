"""`vgc demo`: compile the tiny reference decoder, show its pieces, cold vs warm start, and outputs vs eager.

Unless given a cache root to keep, the demo works in a temporary one (a few MB) and removes it when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SIZES = (1, 3, 17, 64)


def _build(device: str):
    import torch

    import vgc
    from vgc.models import llama

    cfg = llama.tiny_config()
    model = llama.Llama(cfg).to(device)
    config = vgc.CompilationConfig(compile_sizes=[1, 8], cudagraph_mode="none")
    compiled = vgc.compile(model, config=config)
    torch.manual_seed(0)
    return cfg, model, compiled


def _warm_up(device: str):
    """Compile (or load) everything; returns the readiness report with timings, and what it built. Runs in a
    fresh process too."""
    import vgc
    from vgc.models import llama

    vgc.counters.reset()
    start = time.perf_counter()
    cfg, model, compiled = _build(device)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device=device))
    report["ready_seconds"] = time.perf_counter() - start
    return report, (cfg, model, compiled)


def _child_main(device: str) -> None:
    report, _ = _warm_up(device)
    print(json.dumps(report, default=str))


@contextlib.contextmanager
def _demo_cache_root(cache_root: str | None):
    """Yield the demo's cache root, set as `$VGC_CACHE_ROOT` for this process and the warm-start child. On exit,
    error or not, restore the cache variables vgc set, remove a temporary root and say where a kept one is."""
    saved = {var: os.environ.get(var) for var in ("VGC_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")}
    root = cache_root or tempfile.mkdtemp(prefix="vgc-demo-")
    os.environ["VGC_CACHE_ROOT"] = root
    try:
        yield root
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        if cache_root is None:
            shutil.rmtree(root, ignore_errors=True)
            print(f"\nremoved the temporary cache root {root}; use --cache-root DIR to keep the cache, and with it "
                  "the split graph as readable Python (computation_graph.py)")
        else:
            print(f"\ncache kept in {root}; list it with `vgc cache ls --root {root}`")


def main(cache_root: str | None = None, device: str | None = None) -> int:
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with _demo_cache_root(cache_root) as root:
        return _run(root, device, kept=cache_root is not None)


def _run(root: str, device: str, kept: bool) -> int:
    import torch

    print(f"vgc demo: tiny Llama (2 layers) on {device}, torch {torch.__version__}; cache root {root}")

    import vgc
    from vgc.models import llama

    report, (cfg, model, compiled) = _warm_up(device)
    graph = report["computation_graphs"][0] if report.get("computation_graphs") else None
    counters = report["counters"]
    print(f"\npieces: {report['pieces']} total, {report['unique_compiled_pieces']} unique compiled "
          f"(attention runs eagerly between them)")
    print(f"first process : ready in {report['ready_seconds']:6.2f} s  ({counters['dynamo_traces']} Dynamo trace, "
          f"{counters['inductor_compiles']} Inductor compiles, {counters['artifacts_loaded']} artifacts loaded)")

    env = dict(os.environ, VGC_CACHE_ROOT=root)
    proc = subprocess.run([sys.executable, "-m", "vgc.shells.demo", "--child", device], env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        raise SystemExit("vgc demo: the warm-start process failed")
    warm = json.loads(proc.stdout.strip().splitlines()[-1])
    wc = warm["counters"]
    print(f"second process: ready in {warm['ready_seconds']:6.2f} s  ({wc['dynamo_traces']} Dynamo traces: the "
          f"saved trace, {wc['inductor_compiles']} Inductor compiles, {wc['artifacts_loaded']} artifacts loaded)")

    vgc.counters.reset()
    print("\nmax |compiled - eager| (fp32):")
    for kind in ("prefill", "decode"):
        diffs = []
        for n in SIZES:
            with torch.no_grad():
                eager = model(**llama.make_batch(cfg, n, kind, device=device))
                out = compiled(**llama.make_batch(cfg, n, kind, device=device))
            diffs.append(f"T={n}: {(out - eager).abs().max().item():.1e}")
        print(f"  {kind:7s} " + "  ".join(diffs))
    print(f"compiles after warm-up: {vgc.counters.inductor_compiles}, Dynamo traces: {vgc.counters.dynamo_traces}")
    if kept:
        print(f"\nsplit graph written to {graph}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child_main(sys.argv[2])
    else:
        raise SystemExit(main())
