# The host path of a FULL decode call on the CPU, the graph replay stubbed out (simulated capture from tests/):
# `PYTHONPATH=. VLLM_DISABLE_COMPILE_CACHE=1 python benchmarks/results/2026-12-07e/hostprof.py`, 2026-12-07 fifth session.
import sys, time, timeit, cProfile, pstats, dataclasses
sys.path.insert(0, "tests")
import torch, vgc
from vgc.models import llama
from simulated_graphs import install_simulated_capture
install_simulated_capture()
vgc._compat.device_from_inputs = lambda ex: torch.device("cuda")
cfg = dataclasses.replace(llama.tiny_config(), num_layers=16)
print(cfg.num_layers)
model = llama.Llama(cfg).eval()
kv = llama.make_kv_caches(cfg)
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[1, 2, 4, 8]),
                       pad_values=llama.PAD_VALUES)
compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
batch = llama.make_batch(cfg, 1, "decode", kv_caches=kv)
with torch.no_grad():
    compiled(**batch)
from vgc.cudagraph.captured import CapturedGraph
CapturedGraph.replay = lambda self, args=None: self.outputs
def call():
    compiled(**batch)
with torch.no_grad():
    for _ in range(200): call()
    n = 5000
    for r in range(3):
        print("call us", timeit.timeit(call, number=n) / n * 1e6)
    args = compiled._bind((), batch)
    print("bind", timeit.timeit(lambda: compiled._bind((), batch), number=n) / n * 1e6)
    print("contract", timeit.timeit(lambda: compiled.contract.check(args), number=n) / n * 1e6)
    print("graphs.run", timeit.timeit(lambda: compiled.graphs.run(args), number=n) / n * 1e6)
    g = compiled.graphs
    print("pad", timeit.timeit(lambda: g._pad(args, 1, 1), number=n) / n * 1e6)
    print("id_check", timeit.timeit(lambda: g.id_check(args), number=n) / n * 1e6)
    full = g.full[1]
    print("pinned", timeit.timeit(lambda: g._check_pinned(full, args), number=n) / n * 1e6)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): call()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
