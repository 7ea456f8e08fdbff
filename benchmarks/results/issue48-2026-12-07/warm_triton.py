"""warm_profile.py (issue48-2026-12-06d) run in this process, then whether Triton's own triton_key computed its
hash here (its lru cache holds a value) and what every module holding the name answers. Same arguments."""
import runpy, sys
import triton.runtime.cache as triton_cache
original = triton_cache.triton_key
runpy.run_path("benchmarks/results/issue48-2026-12-06d/warm_profile.py", run_name="__main__")
holders = sorted(name for name, m in list(sys.modules.items())
                 if name.startswith(("triton", "torch")) and callable(getattr(m, "triton_key", None)))
print(f"triton_key computed by Triton in this process: {original.cache_info().currsize > 0}; holders {holders}",
      flush=True)
