"""Issue 26: where the host time of a checked FULL replay goes (llama_1b, decode 1 and 8, H200): cProfile over
calls that each wait for the GPU, as `vgc bench decode` times them."""
import cProfile
import pstats
import sys
import time

import torch

import vgc
from vgc.models import llama

cfg = llama.llama_1b_config()
model = llama.Llama(cfg).cuda().eval()
kv = llama.make_kv_caches(cfg, "cuda")
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full_and_piecewise",
                                                           cudagraph_capture_sizes=[1, 8]),
                       pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
for n in (1, 8):
    batch = llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv)
    graph = compiled.graphs.full[n].graph
    for _ in range(50):
        compiled(**batch)
    torch.cuda.synchronize()
    for label, fn in (("checked call", lambda: compiled(**batch)), ("replay alone", graph.replay)):
        times = []
        for _ in range(300):
            start = time.perf_counter()
            fn()
            launched = time.perf_counter()
            torch.cuda.synchronize()
            times.append((launched - start, time.perf_counter() - start))
        times.sort(key=lambda t: t[1])
        mid = times[len(times) // 2]
        print(f"decode {n} {label}: until return {mid[0] * 1e6:.0f} us, until done {mid[1] * 1e6:.0f} us (median)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(1000):
        compiled(**batch)
        torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile, stream=sys.stdout)
    print(f"\ndecode {n}: 1000 checked calls, each waited for")
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
