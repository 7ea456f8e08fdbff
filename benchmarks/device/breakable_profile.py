"""Where a breakable capture of llama_1b spends its time on the GPU: per size, and cProfile's top functions.

usage: PYTHONPATH=. python benchmarks/device/breakable_profile.py OUT_DIR"""
import cProfile
import json
import pstats
import sys
import time

from vgc.shells.bench.timing import breakable_llama, llama_on_cuda

out = sys.argv[1]
cfg, model, kv = llama_on_cuda("llama_1b")
sizes = [1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512]
breakable_llama(model, cfg, kv, whole_decode=True, capture_sizes=[8])   # first-use costs, outside the profile
profile = cProfile.Profile()
start = time.perf_counter()
profile.enable()
graphs, report = breakable_llama(model, cfg, kv, whole_decode=True, capture_sizes=sizes)
profile.disable()
total = time.perf_counter() - start
with open(f"{out}/breakable_profile.txt", "w") as f:
    f.write(f"{len(sizes)} sizes, whole decode too: {total:.2f} s (capture {report['seconds']['capture']:.2f} s)\n")
    stats = pstats.Stats(profile, stream=f)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
json.dump(report, open(f"{out}/breakable_report.json", "w"), indent=1, default=str)
print(f"{total:.2f} s")
