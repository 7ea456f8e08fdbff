"""Issue 47, seventh session of 2026-12-07: the input copies before a FULL replay, on the tensors of a llama_1b
decode-1 call (int64 and int32), three ways: one copy_ each, one multi-tensor copy per dtype (vgc before), and one
multi-tensor copy of the bytes of all of them (vgc's copy_many now). CUDA events around each copy and a sync after
each (as `vgc bench decode` times a call), interleaved in 5 rounds of 200; host time per copy without a sync."""
import statistics, time
import torch
from vgc import _compat
from vgc.models import llama

cfg = llama.llama_1b_config()
batch = llama.make_batch(cfg, 1, "decode", device="cuda")
src = [v for k, v in batch.items() if torch.is_tensor(v) and k != "kv_caches"]
dst = [torch.empty_like(t) for t in src]
print("tensors:", [(k, tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in batch.items()
                   if torch.is_tensor(v)], flush=True)


def by_dtype():
    groups = {}
    for d, s in zip(dst, src):
        groups.setdefault(d.dtype, ([], []))
        groups[d.dtype][0].append(d)
        groups[d.dtype][1].append(s)
    for into, of in groups.values():
        torch._foreach_copy_(into, of)


ways = {"copy_ each": lambda: [d.copy_(s) for d, s in zip(dst, src)],
        "per dtype (before)": by_dtype,
        "bytes, one launch (now)": lambda: _compat.copy_many(dst, src)}
samples = {name: [] for name in ways}
host = {name: [] for name in ways}
for fn in ways.values():
    for _ in range(50):
        fn()
torch.cuda.synchronize()
for _ in range(5):
    for name, fn in ways.items():
        for _ in range(200):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); fn(); end.record(); end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1e3)
        t = time.perf_counter()
        for _ in range(200):
            fn()
        host[name].append((time.perf_counter() - t) / 200 * 1e6)
        torch.cuda.synchronize()
for name in ways:
    s = sorted(samples[name])
    print(f"{name:24s} call {statistics.median(s):6.1f} us (p10 {s[len(s) // 10]:.1f}, p90 {s[9 * len(s) // 10]:.1f});"
          f" host without sync {min(host[name]):5.1f}-{max(host[name]):5.1f} us", flush=True)
for d, s in zip(dst, src):
    d.zero_()
_compat.copy_many(dst, src)
assert all(torch.equal(d, s) for d, s in zip(dst, src))
print("copy_many: every tensor equal", flush=True)
