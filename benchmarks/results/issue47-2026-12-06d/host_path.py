"""Issue 47, session of 2026-12-06 (d): what a default (FULL_AND_PIECEWISE) decode step of llama_1b bf16 spends
outside its graph. For decode 1 and 8: the call as `vgc bench decode` times it (CUDA events around the call, a sync
after each), the graph's replay alone timed the same way, the host time per call with no sync, and a cProfile of
200 calls (the host path's functions by own time). Usage: python host_path.py [tag]   (tag names the run, e.g. the
environment it ran under)"""
import cProfile, io, os, pstats, sys, time
import torch
import vgc
from vgc.models import llama
from vgc.shells.bench.timing import llama_on_cuda, time_steps, warm_llama

tag = sys.argv[1] if len(sys.argv) > 1 else "default"
cfg, model, kv = llama_on_cuda("llama_1b")
compiled, _ = warm_llama(model, cfg, kv, vgc.CompilationConfig(cudagraph_mode="full_and_piecewise"))
for b in (1, 8):
    batch = llama.make_batch(cfg, b, "decode", device="cuda", kv_caches=kv)
    call_ms = time_steps(compiled, batch, warmup=20, steps=200)
    graph = compiled.graphs.full[b].graph
    replay_ms = time_steps(lambda **_: graph.replay(), {}, warmup=20, steps=200)
    torch.cuda.synchronize()
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(200):
            compiled(**batch)
        host_ms = (time.perf_counter() - start) / 200 * 1e3
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            compiled(**batch)
        torch.cuda.synchronize()
        pipelined_ms = (time.perf_counter() - start) / 200 * 1e3
    print(f"[{tag}] decode {b}: call {call_ms:.3f} ms, replay alone {replay_ms:.3f} ms, outside the graph "
          f"{call_ms - replay_ms:.3f} ms; host per call without sync {host_ms:.3f} ms; 200 calls back to back "
          f"{pipelined_ms:.3f} ms each", flush=True)
    if b == 1:
        profiler = cProfile.Profile()
        with torch.no_grad():
            profiler.enable()
            for _ in range(200):
                compiled(**batch)
            profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
        print("\n".join(line[:170] for line in text.getvalue().splitlines()[:45]))
