"""Issue 48: where a cold tiered start's first output goes (llama_1b, cudagraph none, every cache empty): warmup()
and the first decode-8 call (the model itself serving) under cProfile, then a second call; the process exits
without waiting for the background compile. Usage: python tiered_first_call.py PROFILE_OUT"""
import cProfile, pstats, sys, time
import torch, vgc
from vgc.models import llama

cfg = llama.llama_1b_config()
model = llama.Llama(cfg).to("cuda")
kv = llama.make_kv_caches(cfg, device="cuda")
torch.cuda.synchronize()
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="none"), pad_values=llama.PAD_VALUES,
                       uniform_decode=llama.is_uniform_decode, tiered=True)
prof = cProfile.Profile()
prof.enable()
s = time.perf_counter()
compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
warm = time.perf_counter() - s
batch = llama.make_batch(cfg, 8, "decode", device="cuda", kv_caches=kv)
s = time.perf_counter()
with torch.no_grad():
    compiled(**batch)
torch.cuda.synchronize()
first = time.perf_counter() - s
prof.disable()
s = time.perf_counter()
with torch.no_grad():
    compiled(**batch)
torch.cuda.synchronize()
print(f"tiered: warmup {warm:.3f} s, first decode-8 call {first:.3f} s, second {time.perf_counter() - s:.4f} s; "
      f"tier {compiled.tier}", flush=True)
with open(sys.argv[1], "w") as f:
    st = pstats.Stats(prof, stream=f)
    st.sort_stats("cumulative").print_stats(70)
    st.sort_stats("tottime").print_stats(30)
