"""`vgc bench startup --generate SECONDS`: the first seconds of a serving process, for a transformers causal LM.

Each row is a fresh process whose every compile cache starts empty: it builds the model (`vgc bench generate`'s
shapes, random weights, bf16 on CUDA), prepares it its row's way, then calls `generate()` (batch 1, a 64-token
prompt, 128 new tokens, greedy) back to back until SECONDS have passed since the model was built. Rows:
`anchor` (transformers' static cache with `CompileConfig()`), `vgc integration` and `vgc integration tiered`
(`vgc.integrations.transformers.compile(model, tiered=True)`). Columns: the first output (the first generate()'s
end, after the process started), full speed (the end of the first generate() that began on the compiled model,
for a tiered start after its swap, and took within 10% of the median of the last three such) and the new tokens
per second over the window.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time

ROWS = ("anchor", "vgc integration", "vgc integration tiered")
PROMPT, NEW_TOKENS = 64, 128


def _child(row: str, model_name: str, device: str, seconds: float, spawned_at: float) -> None:
    import torch
    import transformers

    from vgc.shells.bench.generate import _build, _shape

    import_s = time.time() - spawned_at
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    start = time.perf_counter()
    model = _build(_shape(model_name, None), device, dtype)
    model_s = time.perf_counter() - start
    kwargs, tiered = {}, row.endswith("tiered")
    if row == "anchor":
        kwargs = {"cache_implementation": "static", "compile_config": transformers.CompileConfig()}
    else:
        from vgc.integrations import transformers as vgc_transformers

        vgc_transformers.compile(model, max_batch_size=1, tiered=tiered)
    prompt = torch.randint(model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    engine = getattr(model, "vgc", None)
    began, ends, compiled = time.time(), [], []
    while not ends or time.time() - began < seconds:
        # A tiered start's tier is None until its first generate() starts it: not yet the compiled model.
        compiled.append(engine is None or not tiered or engine.compiled.tier == "compiled")
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        ends.append(time.time())
    runs = [(end, end - start) for start, end, ready in zip([began, *ends], ends, compiled) if ready]
    settled = statistics.median([took for _, took in runs[-3:]]) if runs else None
    full = next((end for end, took in runs if took <= 1.1 * settled), None)
    stats = engine.stats() if engine is not None else {}
    print(json.dumps({"row": row, "import_s": import_s, "model_s": model_s,
                      "first_output_s": ends[0] - spawned_at,
                      "full_speed_s": float("nan") if full is None else full - spawned_at,
                      "tokens_per_s": NEW_TOKENS * len(ends) / (ends[-1] - began), "generates": len(ends),
                      "window_s": ends[-1] - began, "tier_calls": stats.get("tier_calls"),
                      # a tiered row: "running" (the window ended first), "failed" or "done", and its seconds
                      "background_compile": stats.get("background_compile"),
                      "background_compile_s": stats.get("seconds", {}).get("background_compile"),
                      "background_failure": stats.get("background_failure")}))


def run(model_name: str, device: str, seconds: float, env: dict[str, str]) -> list[dict]:
    """Every row in a fresh process of its own; `env` holds the row's empty cache directories (a fresh set per
    row is made by the caller through `env_for(row)`)."""
    results = []
    for row in ROWS:
        proc = subprocess.run([sys.executable, "-m", "vgc.shells.bench.first_minute", "--child", row, model_name,
                               device, repr(seconds), repr(time.time())], env=env[row], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{row}: the process failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def report(results: list[dict], seconds: float) -> None:
    print(f"{'row':24s}{'import':>10s}{'model':>10s}{'first output':>14s}{'full speed':>12s}"
          f"{'tok/s over ' + format(seconds, 'g') + ' s':>20s}{'generates':>11s}")
    for r in results:
        print(f"{r['row']:24s}{r['import_s']:9.2f}s{r['model_s']:9.2f}s{r['first_output_s']:13.2f}s"
              + (f"{r['full_speed_s']:11.2f}s" if not math.isnan(r["full_speed_s"]) else f"{'none':>12s}")
              + f"{r['tokens_per_s']:20.1f}{r['generates']:11d}"
              + (f"  background compile {r['background_compile']}" if r.get("background_compile") else ""))
    for r in results:
        if r.get("background_failure"):
            print(f"{r['row']}: the background compile failed: {r['background_failure']}")
    print("times from the process's start; full speed: the end of the first generate() begun on the compiled model "
          "within 10% of the last three such (none: no such generate() in the window; a tiered row says whether its "
          "background compile was still running then, failed or done)")


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), float(sys.argv[6]))
    else:
        raise SystemExit("run through `vgc bench startup --generate SECONDS`")
