"""Models Dynamo cannot take whole, on the GPU: eager, torch.compile (default and reduce-overhead, each graph break
its own graph), and `vgc.cudagraph.breakable` (one capture per size, SDPA eager between segments), bf16, one run,
interleaved. Writes JSON to OUT_DIR/graph_broken.json and prints a table.

usage: PYTHONPATH=. python benchmarks/device/graph_broken.py OUT_DIR
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgc.shells.bench.timing import time_interleaved
from vgc.cudagraph import breakable
from vgc.cudagraph.breakable_capture import DEFAULT_BREAKS

WIDTH, HEADS, LAYERS = 1024, 16, 8


class Stack(nn.Module):
    """Pre-norm SDPA blocks with an MLP; `probe(x, i)` between layers is where the two models differ."""

    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(WIDTH) for _ in range(2 * LAYERS))
        self.qkv = nn.ModuleList(nn.Linear(WIDTH, 3 * WIDTH) for _ in range(LAYERS))
        self.out = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.up = nn.ModuleList(nn.Linear(WIDTH, 4 * WIDTH) for _ in range(LAYERS))
        self.down = nn.ModuleList(nn.Linear(4 * WIDTH, WIDTH) for _ in range(LAYERS))

    def probe(self, x, i):
        return x

    def forward(self, x):   # x: [tokens, WIDTH], one causal sequence
        n = x.shape[0]
        for i in range(LAYERS):
            q, k, v = self.qkv[i](self.norms[2 * i](x)).view(1, n, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
            x = x + self.out[i](F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, -1))
            x = x + self.down[i](F.gelu(self.up[i](self.norms[2 * i + 1](x))))
            x = self.probe(x, i)
        return x


class LogsBetweenLayers(Stack):
    """A print and a non-traceable call between layers: Dynamo breaks the graph at each (inside the loop)."""

    def probe(self, x, i):
        if i == 0:
            print(end="")   # a side effect Dynamo cannot trace
        torch._dynamo.graph_break()
        return x


class Monitor(nn.Module):
    def __init__(self):
        super().__init__()
        self.peaks: list[float] = []

    def forward(self, x):
        self.peaks.append(x.abs().amax().item())   # a host read: a graph break for Dynamo, a break for breakable
        return x


class MonitoredLayers(Stack):
    def __init__(self):
        super().__init__()
        self.monitors = nn.ModuleList(Monitor() for _ in range(LAYERS))

    def probe(self, x, i):
        return self.monitors[i](x)


def main(out_dir: str) -> None:
    results = {}
    for name, cls, breaks in [("logs between layers", LogsBetweenLayers, None),
                              ("monitor with .item()", MonitoredLayers, [*DEFAULT_BREAKS, Monitor])]:
        torch.manual_seed(0)
        model = cls().cuda().to(torch.bfloat16).eval()
        results[name] = {}
        for tokens in (16, 256):
            x = torch.randn(tokens, WIDTH, device="cuda", dtype=torch.bfloat16)
            start = time.perf_counter()
            graphs = breakable(model, dynamic_arg_dims={"x": 0}, capture_sizes=[tokens], breaks=breaks)
            report = graphs.warmup(lambda n: (x,))
            capture_s = time.perf_counter() - start
            torch.compiler.reset()
            default = torch.compile(model)
            overhead = torch.compile(model, mode="reduce-overhead")
            fns = {"eager": model, "inductor default": default, "inductor reduce-overhead": overhead,
                   "breakable": graphs}
            with torch.no_grad():
                want = model(x).float()
                diffs = {k: (fn(x).float() - want).abs().max().item() for k, fn in fns.items()}
            ms, _ = time_interleaved(list(fns.values()), {"x": x}, warmup=5, steps=50)
            results[name][tokens] = {"ms": dict(zip(fns, ms)), "max_abs_diff": diffs, "capture_s": capture_s,
                                     "segments": report["segments"][tokens], "breaks": report["breaks"][tokens]}
            print(f"{name}, {tokens} tokens: " + ", ".join(f"{k} {v:.3f} ms" for k, v in zip(fns, ms))
                  + f"; breakable {report['segments'][tokens]} segments, {report['breaks'][tokens]} breaks, "
                  f"captured in {capture_s:.2f} s; max |diff| vs eager {diffs}", flush=True)
    print(f"\nspeed-up over eager (bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}):")
    for name, by_size in results.items():
        for tokens, r in by_size.items():
            eager = r["ms"]["eager"]
            print(f"{name:22s} {tokens:4d} tokens " + "  ".join(f"{k} {eager / v:.2f}x" for k, v in r["ms"].items()))
    with open(f"{out_dir}/graph_broken.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d"), "results": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
