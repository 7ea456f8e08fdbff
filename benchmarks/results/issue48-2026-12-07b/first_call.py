"""Issue 48: a cold tiered start's first output (llama_1b bf16... the bench's shape: cudagraph none, decode 8), every
cache empty: warmup() then the first call (the model itself serving), then the process exits without waiting for
the background compile. With the head start (HeadStart present in the tree): how long the first call waited for
it. Usage: python first_call.py LABEL"""
import sys, time
t0 = time.perf_counter()
import torch, vgc
from vgc.models import llama
import vgc.background_compile as bc

waited = []
if hasattr(bc, "HeadStart"):
    original = bc.HeadStart.wait
    def timed(self, *a, **k):
        s = time.perf_counter(); original(self, *a, **k); waited.append(time.perf_counter() - s)
    bc.HeadStart.wait = timed
cfg = llama.llama_1b_config()
model = llama.Llama(cfg).to("cuda")
kv = llama.make_kv_caches(cfg, device="cuda")
torch.cuda.synchronize()
built = time.perf_counter()
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="none"), pad_values=llama.PAD_VALUES,
                       uniform_decode=llama.is_uniform_decode, tiered=True)
compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
warm = time.perf_counter() - built
batch = llama.make_batch(cfg, 8, "decode", device="cuda", kv_caches=kv)
s = time.perf_counter()
with torch.no_grad():
    compiled(**batch)
torch.cuda.synchronize()
first = time.perf_counter() - s
print(f"{sys.argv[1]}: build {built - t0:.2f} s, warmup {warm:.3f} s, first call {first:.3f} s, "
      f"first output {time.perf_counter() - built:.3f} s after the build; head start waited "
      f"{'%.3f s' % waited[0] if waited else 'n/a'}; tier {compiled.tier}", flush=True)
