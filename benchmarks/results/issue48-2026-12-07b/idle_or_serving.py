"""Issue 48: does serving slow the background compile? A cold tiered start (llama_1b bf16, cudagraph none, every
cache empty) that either serves decode-8 calls in a loop until the swap (serving) or waits for the compile with no
call (idle); prints the child's phases. Usage: python idle_or_serving.py serving|idle"""
import json, sys, time
t0 = time.time()
import torch, vgc
from vgc.models import llama

cfg = llama.llama_1b_config()
model = llama.Llama(cfg).to("cuda")
kv = llama.make_kv_caches(cfg, device="cuda")
compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="none"), pad_values=llama.PAD_VALUES,
                       uniform_decode=llama.is_uniform_decode, tiered=True)
compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
batch = llama.make_batch(cfg, 8, "decode", device="cuda", kv_caches=kv)
with torch.no_grad():
    compiled(**batch)
    if sys.argv[1] == "idle":
        compiled.wait_for_compile()
    while compiled.background_compile == "running":
        compiled(**batch)
    compiled(**batch)
torch.cuda.synchronize()
stats = compiled.stats()
print(sys.argv[1], f"full speed {time.time() - t0:.2f} s;", json.dumps({k: round(v, 2) for k, v in
      {**stats["background_seconds"], "background": stats["seconds"]["background_compile"]}.items()}),
      stats["tier_calls"], flush=True)
