# The integration's first generate() after the model's build, plain or tiered, in a fresh process with an empty cache root:
# `for m in plain tiered plain tiered; do VGC_CACHE_ROOT=$(mktemp -d) python integration_first_generate.py $m; done`
# (CPU, 2 cores, torch 2.13, transformers 5.25, 2026-12-06: integration_first_generate.txt)
import json, sys, time, os
t_start = time.time()
import torch, transformers, vgc
from vgc.integrations import transformers as vt
t_import = time.time() - t_start
torch.manual_seed(0)
s = time.perf_counter()
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")).eval()
model.generation_config.pad_token_id = 0
build = time.perf_counter() - s
s = time.perf_counter()
vt.compile(model, max_batch_size=2, max_cache_len=64, tiered=sys.argv[1] == "tiered")
with torch.no_grad():
    out = model.generate(torch.tensor([[5, 17, 42, 8]]), max_new_tokens=8, do_sample=False)
first = time.perf_counter() - s
print(json.dumps({"mode": sys.argv[1], "import": round(t_import, 2), "build": round(build, 2), "first_generate_after_build": round(first, 2), "tier": model.vgc.stats().get("tier")}))
if sys.argv[1] == "tiered":
    model.vgc.compiled.wait_for_compile(600)
