"""Debug aid: trace the transformers integration on one device with +dynamic logs (not a test)."""
import sys
import torch
import transformers
from vgc.integrations import transformers as vgc_transformers

device = sys.argv[1]
cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               attn_implementation="sdpa")
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).eval().to(device)
options = {} if len(sys.argv) < 3 or sys.argv[2] == "-" else {"cudagraph_mode": sys.argv[2]}
if len(sys.argv) > 3:
    options["dynamic_shapes_config"] = {"type": sys.argv[3]}
vgc_transformers.compile(model, max_batch_size=4, max_cache_len=64, config=options or None)
try:
    model.vgc.warmup()
    print("OK", device, options)
except Exception as e:
    print("FAILED", device, options, type(e).__name__, str(e).splitlines()[:3])
