"""Issue 28: what the attention slots of every graph cost on the HF Qwen2-VL tower (H200).

Two managers over one tower (shared weights, same budgets 64..16384): the adapter's real minimum image (56^2, 4
tokens: a budget of b tokens carries b // 4 attention slots) against 224^2 (64 tokens: b // 64 slots). Chat
requests (scenario a of `vgc bench encoder`), each timed alone, the two managers alternating request by request.
    PYTHONPATH=. python benchmarks/encoder_slots.py --requests 200 --json out.json
"""

import argparse
import json
import statistics
import time

import torch

import vgc
from vgc.shells.bench.encoder import _hf_qwen2_vl, _percentile, _vit_layouts, _vit_request
from vgc.encoder import EncoderCudaGraphManager
from vgc.integrations.transformers import vision_adapter
from vgc.models import vit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    cfg = vit.qwen2_vl_vit_config()
    tower = _hf_qwen2_vl(cfg, torch.device("cuda")).tower
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True)
    managers = {}
    for name, side in (("slots b/4 (56^2 minimum)", 56), ("slots b/64 (224^2 minimum)", 224)):
        adapter = vision_adapter(tower, min_pixels=side * side, max_frame_pixels=cfg.max_pixels)
        managers[name] = EncoderCudaGraphManager(adapter, config)
        stats = managers[name].capture()
        print(name, "budgets", stats["budgets"]["default"][:4], "... capture", stats["seconds"], flush=True)
    requests = [_vit_request(vit, cfg, w, f, torch.device("cuda"), seed=i)
                for i, (w, f) in enumerate(_vit_layouts("a", args.requests, 0))]
    times = {name: [] for name in managers}
    with torch.no_grad():
        for kw in requests[:20]:
            for m in managers.values():
                m.execute(kw)
        for i, kw in enumerate(requests):
            order = list(managers.items()) if i % 2 == 0 else list(managers.items())[::-1]
            for name, m in order:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                m.execute(kw)
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) * 1e3)
    result = {}
    for name, ts in times.items():
        s = managers[name].stats()
        result[name] = {"mean_ms": statistics.mean(ts), "p50_ms": _percentile(ts, 50), "p99_ms": _percentile(ts, 99),
                        "path_items": s["path_items"], "graph_savings": s["graph_savings"]["default"]}
        print(f"{name}: mean {result[name]['mean_ms']:.3f} ms, p50 {result[name]['p50_ms']:.3f}, "
              f"p99 {result[name]['p99_ms']:.3f}; items {s['path_items']['default']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"requests": args.requests, "rows": result, "latencies_ms": times}, f)


if __name__ == "__main__":
    main()
