"""Warm starts of two vgc trees, interleaved (A, B, A, B, ...): each tree gets its own empty cache root and one
cold start first. Prints one JSON line per start and a summary of warmup(), load trace, load artifacts and
first output minus import and model build.

usage: python warm_ab.py TREE_A TREE_B RUNS MODEL DEVICE OUT_JSON   (then one profiled warm start of B:
OUT-profile.txt)
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def start(tree: str, root: str, model: str, device: str, profile: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, VGC_CACHE_ROOT=os.path.join(root, "vgc"),
               TRITON_CACHE_DIR=os.path.join(root, "triton"), CUDA_CACHE_PATH=os.path.join(root, "cuda"))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    prefix = ["-m", "cProfile", "-o", profile] if profile else []
    proc = subprocess.run([sys.executable, *prefix, "-m", "vgc.shells.bench.startup", "--child", model, device, "none",
                           repr(time.time())], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r["after_build_s"] = r["first_output_s"] - r["import_s"] - r["model_s"]
    return r


def main() -> None:
    tree_a, tree_b, runs, model, device, out = sys.argv[1:7]
    roots = {tree: tempfile.mkdtemp(prefix="warm-ab-") for tree in (tree_a, tree_b)}
    results = {tree: {"cold": start(tree, roots[tree], model, device), "warm": []} for tree in (tree_a, tree_b)}
    for _ in range(int(runs)):
        for tree in (tree_a, tree_b):
            r = start(tree, roots[tree], model, device)
            results[tree]["warm"].append(r)
            print(tree, json.dumps(r), flush=True)
    keys = ("warmup_s", "load_trace_s", "load_artifacts_s", "after_build_s", "import_s", "first_output_s")
    for tree in (tree_a, tree_b):
        warm = results[tree]["warm"]
        print(tree, "cold warmup %.2f" % results[tree]["cold"]["warmup_s"],
              " ".join(f"{k} median {statistics.median(r[k] for r in warm):.3f} "
                       f"[{min(r[k] for r in warm):.3f}-{max(r[k] for r in warm):.3f}]" for k in keys))
        assert all(r["inductor_compiles"] == 0 and r["dynamo_traces"] == 0 for r in warm), "a warm start compiled"
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    # one more warm start of B under cProfile: where its time goes
    profile = out.replace(".json", ".prof")
    start(tree_b, roots[tree_b], model, device, profile=profile)
    import pstats
    with open(out.replace(".json", "-profile.txt"), "w") as f:
        stats = pstats.Stats(profile, stream=f)
        stats.sort_stats("cumulative").print_stats(150)
        stats.print_callees("warmup|_load_impl|wrap_post_compile|environment_factors|aot_program_load")


if __name__ == "__main__":
    main()
