"""(issue 48, 2026-12-06: also names the compiler modules the start imported) One start of vgc.compile on llama_1b (cudagraph_mode none): cold or warm, optionally profiled.
Usage: python warm_profile.py {cold|warm|warm-preimported} [profile_out]"""
import os, sys, time
spawned = float(os.environ.get("SPAWNED", time.time()))
import torch, vgc
from vgc.models import llama
t_import = time.time() - spawned
mode = sys.argv[1]
device = "cuda" if torch.cuda.is_available() else "cpu"
cfg = llama.llama_1b_config() if device == "cuda" else llama.tiny_config()
s = time.perf_counter()
model = llama.Llama(cfg).to(device)
if device == "cuda":
    torch.cuda.synchronize()
t_model = time.perf_counter() - s
kv = llama.make_kv_caches(cfg, device=device)
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="none"), pad_values=llama.PAD_VALUES,
                       uniform_decode=llama.is_uniform_decode)
pre = 0.0
if mode == "warm-preimported":
    s = time.perf_counter()
    import torch._inductor.compile_fx, torch._inductor.codecache as cc
    cc.torch_key()
    pre = time.perf_counter() - s
prof = None
if len(sys.argv) > 2:
    import cProfile
    prof = cProfile.Profile(); prof.enable()
s = time.perf_counter()
report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device=device, kv_caches=kv))
warm = time.perf_counter() - s
if prof:
    prof.disable()
    import pstats
    with open(sys.argv[2], "w") as f:
        st = pstats.Stats(prof, stream=f)
        st.sort_stats("cumulative").print_stats(120)
        st.sort_stats("tottime").print_stats(50)
COMPILER = [m for m in ("torch._inductor.compile_fx", "torch._inductor.select_algorithm", "torch._inductor.lowering", "torch._inductor.debug") if m in sys.modules]
print(f"{mode} VGC_LOAD_WITHOUT_COMPILER={os.environ.get('VGC_LOAD_WITHOUT_COMPILER', '1')}: import {t_import:.2f} model {t_model:.2f} preimport {pre:.2f} warmup {warm:.3f} "
      f"first_output {time.time() - spawned:.2f} seconds {({k: round(v, 3) for k, v in report['seconds'].items()})} "
      f"traces {vgc.counters.dynamo_traces} compiles {vgc.counters.inductor_compiles} loaded {vgc.counters.artifacts_loaded} compiler {COMPILER}",
      flush=True)
