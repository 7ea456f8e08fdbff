"""Where a tiered cold start's first output goes: the model's first eager decode call (llama_1b, bf16, batch 8)
in a fresh process with empty caches, split into Triton's compiles and the rest.
Usage: python first_call.py {triton|no-triton}   (no-triton: vgc's attention op on its torch path)"""
import os, sys, time
spawned = float(os.environ.get("SPAWNED", time.time()))
import torch
from vgc.models import llama
from vgc.ops import triton_attention
t_import = time.time() - spawned
variant = sys.argv[1]
if variant == "no-triton":
    triton_attention.HAS_TRITON = False
compiles = []
try:
    import triton.compiler.compiler as tc
    real = tc.compile
    def timed(*a, **k):
        s = time.perf_counter(); out = real(*a, **k); compiles.append(time.perf_counter() - s); return out
    tc.compile = timed
    import triton.runtime.jit as jit
    if getattr(jit, "compile", None) is real:
        jit.compile = timed
except Exception as e:
    print("no triton hook:", e)
cfg = llama.llama_1b_config()
s = time.perf_counter(); model = llama.Llama(cfg).cuda(); torch.cuda.synchronize(); t_model = time.perf_counter() - s
kv = llama.make_kv_caches(cfg, device="cuda")
calls = []
with torch.no_grad():
    for kind in ("decode", "decode", "prefill", "decode"):
        batch = llama.make_batch(cfg, 8, kind, device="cuda", kv_caches=kv)
        s = time.perf_counter(); out = model(**batch); torch.cuda.synchronize(); calls.append(time.perf_counter() - s)
print(f"{variant}: import {t_import:.2f} s, model {t_model:.2f} s, calls (decode, decode, prefill, decode) "
      f"{', '.join(f'{c:.3f}' for c in calls)} s; Triton compiles {len(compiles)} taking {sum(compiles):.2f} s; "
      f"finite {bool(torch.isfinite(out).all())}", flush=True)
