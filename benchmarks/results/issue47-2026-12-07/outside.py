"""Issue 47, second session of 2026-12-07: where a default (FULL_AND_PIECEWISE) decode call of llama_1b bf16 spends
the ~0.09 ms outside its graph. One process. 1) Interleaved (time_interleaved, CUDA events around each call, a sync
after each): the call; the call without the token-id check; the dispatcher alone (no binding, no contract check);
the dispatcher alone without the id check; the graph's replay alone. 2) A timeline of 300 calls: host perf_counter
stamps at each step of the call and a CUDA event recorded just before the graph's launch (its GPU time from the call's
start event is when the GPU could begin the graph). Usage: python outside.py [batch ...]"""
import statistics, sys, time
import torch
import vgc
from vgc.models import llama
from vgc.shells.bench.timing import llama_on_cuda, time_interleaved, warm_llama

cfg, model, kv = llama_on_cuda("llama_1b")
compiled, _ = warm_llama(model, cfg, kv, vgc.CompilationConfig(cudagraph_mode="full_and_piecewise"))
disp = compiled.graphs
ids_check = disp.id_check
for b in [int(a) for a in sys.argv[1:]] or [1]:
    batch = llama.make_batch(cfg, b, "decode", device="cuda", kv_caches=kv)
    seen = {}
    run = disp.run
    disp.run = lambda arguments: seen.setdefault("a", arguments) and run(arguments)
    with torch.no_grad():
        compiled(**batch)
    del disp.run
    arguments = seen["a"]

    def without_ids(fn):
        def call(**kw):
            disp.id_check = None
            try:
                return fn(**kw)
            finally:
                disp.id_check = ids_check
        return call
    graph = disp.full[b].graph
    fns = {"call": compiled, "call, no id check": without_ids(compiled),
           "dispatcher alone": lambda **_: disp.run(arguments),
           "dispatcher alone, no id check": without_ids(lambda **_: disp.run(arguments)),
           "replay alone": lambda **_: graph.replay()}
    ms, _ = time_interleaved(list(fns.values()), batch, warmup=30, steps=600, rounds=10)
    print(f"decode {b}: " + "; ".join(f"{name} {m:.3f} ms" for name, m in zip(fns, ms)), flush=True)

    # the timeline
    stamps = {}
    def stamp(name):
        stamps.setdefault(name, []).append(time.perf_counter())
    pre = []
    class Stamped:
        def replay(self):
            stamp("graph launch")
            e = torch.cuda.Event(enable_timing=True); e.record(); pre.append(e)
            graph.replay()
            stamp("graph launched")
    def wrap(obj, attr, name):
        inner = getattr(obj, attr)
        def f(*a, **k):
            stamp(name + " in")
            out = inner(*a, **k)
            stamp(name + " out")
            return out
        setattr(obj, attr, f)
    full = disp.full[b]
    full.graph = Stamped()
    wrap(compiled.contract, "check", "contract")
    wrap(disp, "_pad", "pad")
    class StampedCheck:   # the check called before the replay, or begun before the padding and ended there
        def __call__(self, arguments):
            stamp("ids in"); ids_check(arguments); stamp("ids out")

        def begin(self, arguments):
            stamp("ids begin in"); finish = ids_check.begin(arguments); stamp("ids begin out")

            def end():
                stamp("ids in"); finish(); stamp("ids out")
            return end
    disp.id_check = StampedCheck()
    starts, ends, t0, t1 = [], [], [], []
    with torch.no_grad():
        for i in range(330):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.append(time.perf_counter()); s.record()
            compiled(**batch)
            t1.append(time.perf_counter()); e.record(); e.synchronize()
            starts.append(s); ends.append(e)
    full.graph = graph
    for attr in ("check",):
        del compiled.contract.check
    del disp._pad
    disp.id_check = ids_check
    keep = range(30, 330)
    med = lambda xs: statistics.median(xs)
    print(f"decode {b} timeline (median of 300 calls, µs from the host's call start):")
    for name, values in stamps.items():
        print(f"  {name:16s} {med([(values[i] - t0[i]) * 1e6 for i in keep]):7.1f}")
    print(f"  {'call returned':16s} {med([(t1[i] - t0[i]) * 1e6 for i in keep]):7.1f}")
    print(f"  GPU: start event -> graph launch event {med([starts[i].elapsed_time(pre[i]) * 1e3 for i in keep]):.1f} µs; "
          f"graph launch event -> end event {med([pre[i].elapsed_time(ends[i]) * 1e3 for i in keep]):.1f} µs; "
          f"whole {med([starts[i].elapsed_time(ends[i]) * 1e3 for i in keep]):.1f} µs", flush=True)
