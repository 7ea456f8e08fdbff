"""Issue 26: where the default FULL_AND_PIECEWISE decode step spends its time at batch 1 and 64 (H200)."""
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from profile_decode import kernel_table  # noqa: E402

import vgc  # noqa: E402
from vgc.shells.bench.timing import time_steps  # noqa: E402
from vgc.models import llama  # noqa: E402

cfg = llama.llama_1b_config()
model = llama.Llama(cfg).cuda().eval()
kv = llama.make_kv_caches(cfg, "cuda")
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full_and_piecewise",
                                                           cudagraph_capture_sizes=[1, 8, 64, 256]),
                       pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
for n in (1, 64, 256):
    batch = llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv)
    graph = compiled.graphs.full[n].graph
    print(f"\ndecode {n}: step {time_steps(compiled, batch, 10, 100):.3f} ms; replay alone "
          f"{time_steps(lambda **_: graph.replay(), {}, 10, 100):.3f} ms")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        compiled(**batch)
    host = (time.perf_counter() - start) / 200
    torch.cuda.synchronize()
    print(f"  host per call (no waiting): {host * 1e6:.0f} us")
    kernel_table(compiled, batch)
