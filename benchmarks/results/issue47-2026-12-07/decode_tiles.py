"""Issue 47, 2026-12-07: the default decode step (FULL_AND_PIECEWISE) with the shipped tiles against the tiles
sweep_chain_tiles.py chose in the same call (its JSON, argv[1]), both built in this process over the same weights
and timed interleaved as `vgc bench decode` times a call, decode 1 and 8."""
import json, sys
import torch
import vgc
from vgc.models import llama
from vgc.ops import triton_skinny_mm as t
from vgc.shells.bench.timing import llama_on_cuda, time_interleaved, warm_llama

chosen = json.load(open(sys.argv[1]))
cfg, model, kv = llama_on_cuda("llama_1b")
config = vgc.CompilationConfig(cudagraph_mode="full_and_piecewise")
shipped, _ = warm_llama(model, cfg, kv, config)
for key, tile in chosen["gemv_tiles"]:
    t.GEMV_TILES[tuple(key)] = t.Tile(**tile)
for key, tile in chosen["fused_tiles"]:
    t.FUSED_TILES[tuple(key)] = t.Tile(**tile)
swept, _ = warm_llama(model, cfg, kv, config)   # the same artifacts (cache), its graphs captured with the new tiles
for b in (1, 8):
    batch = llama.make_batch(cfg, b, "decode", device="cuda", kv_caches=kv)
    with torch.no_grad():
        a, c = shipped(**batch).float(), swept(**batch).float()
        error = ((a - c).norm() / a.norm()).item()
    ms, _ = time_interleaved([shipped, swept], batch, warmup=20, steps=300, rounds=6)
    print(f"decode {b}: shipped tiles {ms[0]:.3f} ms, chain-swept tiles {ms[1]:.3f} ms "
          f"({ms[0] / ms[1]:.3f}x); outputs' relative difference {error:.1e}", flush=True)
