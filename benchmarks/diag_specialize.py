"""Debug aid (not a test): where a symbolic size of the transformers integration's trace gets pinned to a
number. Prints the Python stack of every replacement of a size symbol by a constant, then tries the warm-up.

    PYTHONPATH=. python benchmarks/diag_specialize.py cuda [fuse_sibling_matmuls=0]
"""
import sys
import traceback

import sympy
import torch
import transformers
from torch.fx.experimental import symbolic_shapes

from vgc.integrations import transformers as vgc_transformers

original = symbolic_shapes.ShapeEnv._set_replacement


def _set_replacement(self, a, tgt, msg):
    if isinstance(tgt, (int, sympy.Integer)) or getattr(tgt, "is_number", False):
        print(f"=== {a} -> {tgt} ({msg})")
        print("".join(traceback.format_stack()[-28:-1]))
    return original(self, a, tgt, msg)


symbolic_shapes.ShapeEnv._set_replacement = _set_replacement
device = sys.argv[1]
options = {"pass_config": {"fuse_sibling_matmuls": False}} if "fuse_sibling_matmuls=0" in sys.argv else {}
cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               attn_implementation="sdpa")
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).eval().to(device)
vgc_transformers.compile(model, max_batch_size=4, max_cache_len=64, config=options or None)
try:
    model.vgc.warmup()
    print("OK", device, options)
except Exception as e:
    print("FAILED", device, options, type(e).__name__, str(e).splitlines()[:3])
