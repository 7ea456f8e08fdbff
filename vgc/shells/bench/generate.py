"""`vgc bench generate`: transformers `generate()` on an unmodified causal LM, every way of running it, in one run.

Model shapes (random weights, bf16 on CUDA, fp32 on the CPU): `llama_1b` (Llama-3.2-1B: 16 layers, hidden 2048,
32/8 heads, vocab 128256), `qwen2_0_5b` (Qwen2-0.5B: 24 layers, hidden 896, 14/2 heads, vocab 151936), `tiny`
(2 layers, hidden 64: a smoke run). Greedy, `--prompt` random ids per row, exactly `--new-tokens` new tokens.

Rows (each on its own copy of the model; vgc's fusion pass rebinds weights):
- `eager`: generate() on transformers' default dynamic cache;
- `anchor`: transformers' own fast path, `cache_implementation="static"` + `compile_config=CompileConfig()`
  (Inductor, reduce-overhead, fullgraph);
- `vgc drop-in (dynamic cache)`: `model.forward = torch.compile(model.forward, backend="vgc")`, nothing else;
- `vgc CompileConfig (static cache)`: the anchor with `CompileConfig(backend="vgc")`, FULL_AND_PIECEWISE, split
  at SDPA;
- `vgc integration`: `vgc.integrations.transformers.compile(model)`: generate()'s loop on the device (a sampler
  graph after each decode graph, no host sync per token);
- `vgc integration unfused`: the same with the `skinny_matmul_fusion` pass off (the default before it);
- `vgc integration (RoPE apart)`: the same with only `skinny_matmul_rope` off (q and k rotated by Inductor's kernels);
- `vgc integration (matmul angles)`: the same with only `outer_products` off (the rotary angles a K = 1 matmul, as
  torch before 2.13 compiles them);
- `vgc integration (host loop)`: the same with `device_loop=False`: transformers' own loop around vgc's decode graphs;
- `vgc breakable (dynamic cache)`: `vgc.integrations.transformers.breakable(model, batch_sizes=[batch])`: no Dynamo,
  no Inductor; decode steps replay breakable CUDA graphs on the default dynamic cache.

Columns: `first s` (the row's first generate(): compile, capture and one generate; the bench starts with empty vgc,
Inductor and Triton caches), new tokens/s and ms per token (median of `--reps` generate() calls, the rows interleaved: A,
B, C, A, B, C, ...), the decode forward alone (CUDA events around each one-token model call, in separate generate()
calls so the events do not slow the timed ones; for the integration rows, its FULL decode graph replayed alone),
the host µs that call takes to return (what the host spends launching one decode step: the anchor's cudagraph-tree
replay against vgc's), `kernels` (the integration rows: kernels, memsets and copies in one decode graph, from the
profiler), `over ms` (what generate() spends per token outside the decode step: the median time of a
generate() of `--new-tokens` tokens, less that of one token (the prefill and the calls around it), over the tokens
between, less the decode forward), and how many leading new tokens equal eager's (bf16 with random weights diverges
on near-ties: exact equality is what the fp32 CPU tests check).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import tempfile
import time

import torch

from vgc.shells.bench.timing import kernel_profile

SPLIT_AT_SDPA = ["aten::scaled_dot_product_attention"]


def _shape(name: str, layers: int | None):
    import transformers

    if name == "llama_1b":
        return transformers.LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                        num_hidden_layers=layers or 16, num_attention_heads=32,
                                        num_key_value_heads=8, max_position_embeddings=4096, rope_theta=500000.0,
                                        attn_implementation="sdpa")
    if name == "qwen2_0_5b":
        return transformers.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                        num_hidden_layers=layers or 24, num_attention_heads=14,
                                        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
                                        attn_implementation="sdpa")
    if name == "tiny":
        return transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=layers or 2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=256, attn_implementation="sdpa")
    raise ValueError(f"unknown model {name!r}")


MODELS = ("llama_1b", "qwen2_0_5b", "tiny")
ROWS = ("eager", "anchor", "vgc drop-in (dynamic cache)", "vgc CompileConfig (static cache)", "vgc integration",
        "vgc integration unfused", "vgc integration (RoPE apart)", "vgc integration (matmul angles)",
        "vgc integration (host loop)",
        "vgc breakable (dynamic cache)")
_INTEGRATION_PASSES = {"vgc integration unfused": {"skinny_matmul_fusion": False},
                       "vgc integration (RoPE apart)": {"skinny_matmul_rope": False},
                       "vgc integration (matmul angles)": {"outer_products": False}}


def _build(config, device: str, dtype: torch.dtype):
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    model.generation_config.eos_token_id = None   # exactly --new-tokens tokens per row
    model.generation_config.pad_token_id = 0
    return model


class _ForwardTimer:
    """CUDA events around each one-token call of a callable (a decode step), and the host time the call takes
    to return (launches only: nothing waits for the GPU); bypassed when `on` is False."""

    def __init__(self, fn):
        # generate() reads the forward's signature to choose its keyword arguments: the timer shows fn's
        functools.update_wrapper(self, fn, updated=())
        self.fn, self.on, self.events, self.host = fn, False, [], []

    def __call__(self, *args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not self.on or ids is None or ids.shape[-1] != 1:
            return self.fn(*args, **kwargs)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.host.append(time.perf_counter() - began)
        end.record()
        self.events.append((start, end))
        return out

    def take(self) -> tuple[float, float]:
        """(median GPU ms, median host µs) per call since the last take."""
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in self.events]
        host = self.host
        self.events, self.host = [], []
        if not times:
            return float("nan"), float("nan")
        return statistics.median(times), 1e6 * statistics.median(host)


def _rows(base, names: list[str], batch: int):
    """name -> (model, generate kwargs, timer install). Built lazily, in order: each is a fresh copy."""
    import transformers

    def anchor_kwargs(**compile_kwargs):
        return {"cache_implementation": "static",
                "compile_config": transformers.CompileConfig(**compile_kwargs)}

    def build(name):
        model = copy.deepcopy(base)
        kwargs = {}
        if name == "anchor":
            kwargs = anchor_kwargs()
        elif name == "vgc drop-in (dynamic cache)":
            model.forward = torch.compile(model.forward, backend="vgc")
        elif name == "vgc CompileConfig (static cache)":
            kwargs = anchor_kwargs(backend="vgc", mode=None, fullgraph=True,
                                   options={"cudagraph_mode": "full_and_piecewise", "splitting_ops": SPLIT_AT_SDPA})
        elif name.startswith("vgc integration"):
            from vgc.integrations import transformers as vgc_transformers
            passes = _INTEGRATION_PASSES.get(name)
            vgc_transformers.compile(model, max_batch_size=batch, device_loop=name != "vgc integration (host loop)",
                                     config={"pass_config": passes} if passes else None)
        elif name == "vgc breakable (dynamic cache)":
            from vgc.integrations import transformers as vgc_transformers
            vgc_transformers.breakable(model, batch_sizes=[batch])
        return model, kwargs

    return {name: (lambda name=name: build(name)) for name in names}


def _decode_graph_ms(model, batch: int, replays: int = 20) -> tuple[float, float, float]:
    """The integration's decode step alone: its FULL graph replayed on what its buffers hold (the last
    generate()'s inputs); (median GPU ms, median host µs, kernels) per replay."""
    step = model.vgc.graph_step(batch)
    if step is None:
        return float("nan"), float("nan"), float("nan")
    graphs, events, host = model.vgc.compiled.graphs, [], []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        graphs.replay_full(step.padded)
        host.append(time.perf_counter() - began)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    kernels, _ = kernel_profile(lambda: graphs.replay_full(step.padded), {})
    return statistics.median(s.elapsed_time(e) for s, e in events), 1e6 * statistics.median(host), kernels


def _install_timer(name: str, model) -> _ForwardTimer | None:
    """Wrap the call generate() makes for a decode step: the compiled call for the anchor-style rows (after the
    first generate() made it), the forward for the others."""
    if not torch.cuda.is_available():
        return None
    if name in ("anchor", "vgc CompileConfig (static cache)"):
        if not hasattr(model, "_compiled_call"):
            return None
        timer = _ForwardTimer(model._compiled_call)
        model._compiled_call = timer
        return timer
    timer = _ForwardTimer(model.forward)
    model.forward = timer
    return timer


def _report(args, dtype, device, results: dict, failed: dict) -> None:
    print(f"\nvgc bench generate: transformers {args.model}{f' ({args.layers} layers)' if args.layers else ''} "
          f"{str(dtype).replace('torch.', '')} on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, "
          f"torch {torch.__version__}; prompt {args.prompt}, {args.new_tokens} new tokens, median of {args.reps}")
    header = (f"{'row':34s}{'batch':>6s}{'first s':>9s}{'tok/s':>9s}{'ms/tok':>8s}{'spread ms/tok':>15s}"
              f"{'fwd ms':>8s}{'over ms':>8s}{'host us':>8s}{'kernels':>8s}{'= eager':>8s}{'vs anchor':>10s}"
              f"{'fwd vs anchor':>14s}")
    print(header)
    for batch, rows in results.items():
        anchor = rows.get("anchor")
        for name, r in rows.items():
            lo, hi = (1000 * s / args.new_tokens for s in r["spread_s"])
            fwd = r["decode_forward_ms"]
            ratio = f"{r['tok_s'] / anchor['tok_s']:9.2f}x" if anchor else f"{'-':>10s}"
            fwd_ratio = f"{anchor['decode_forward_ms'] / fwd:13.2f}x" if anchor and fwd and \
                anchor["decode_forward_ms"] else f"{'-':>14s}"
            print(f"{name:34s}{batch:>6s}{r['first_s']:9.2f}{r['tok_s']:9.1f}{r['ms_per_token']:8.2f}"
                  f"{f'{lo:.2f}-{hi:.2f}':>15s}{(fwd if fwd else float('nan')):8.3f}"
                  f"{(r['ms_per_later_token'] - fwd if fwd else float('nan')):8.3f}"
                  f"{(r['decode_host_us'] if r['decode_host_us'] else float('nan')):8.0f}"
                  f"{(r.get('decode_kernels') or float('nan')):8.0f}"
                  f"{r['leading_tokens_equal_eager']:8d}{ratio}{fwd_ratio}")
    for batch, rows in failed.items():
        for name, why in rows.items():
            print(f"{name:34s}{batch:>6s}  FAILED: {why}")
    print("\ncounted over the timed generate() calls (after the first):")
    for batch, rows in results.items():
        for name, r in rows.items():
            print(f"  batch {batch} {name}: {r['after_first']}")


def _write_json(args, device, results: dict, failed: dict) -> None:
    with open(args.json, "w") as f:
        json.dump({"model": args.model, "layers": args.layers, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "date": time.strftime("%Y-%m-%d"), "prompt": args.prompt, "new_tokens": args.new_tokens,
                   "reps": args.reps, "results": results, "failed": failed}, f, indent=1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgc bench generate",
        description="Greedy transformers generate() on an unmodified causal LM (random weights), every way of running "
                    "it: eager, transformers' static-cache compile, vgc drop-in and CompileConfig, vgc's integration "
                    "and breakable graphs; first-call seconds, tokens/s, ms per token and the decode step alone.")
    parser.add_argument("--model", choices=MODELS, default="llama_1b",
                        help="the model's shape: llama_1b (Llama-3.2-1B), qwen2_0_5b (Qwen2-0.5B) or tiny (a smoke "
                             "run) (default: %(default)s)")
    parser.add_argument("--layers", type=int, help="fewer layers than the real shape, for quick runs (default: the "
                                                   "real shape's)")
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes (default: %(default)s)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=128,
                        help="new tokens each generate() call makes, exactly (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=3, help="timed generate() calls per row (default: %(default)s)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of rows: {', '.join(ROWS)}; eager runs "
                                                   "always, as the reference (default: all)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the model runs (default: cuda when available, here %(default)s)")
    parser.add_argument("--json", help="also write the results to this file (default: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Every cache starts empty, so each row's first generate() is cold (rows later in the run may find Triton
    # kernels an earlier row built: same kernels are rare across strategies, but not impossible).
    root = tempfile.mkdtemp(prefix="vgc-bench-generate-")
    os.environ.setdefault("VGC_CACHE_ROOT", os.path.join(root, "vgc"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(root, "triton"))   # else ~/.triton keeps kernels warm
    import vgc

    vgc._compat.allow_recompiles(64)
    names = [r.strip() for r in args.only.split(",") if r.strip()] or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from {list(ROWS)}")
    if "eager" not in names:
        names.insert(0, "eager")   # the reference for the token-match column
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = _shape(args.model, args.layers)
    results, failed = {}, {}
    for batch in [int(b) for b in args.batch.split(",")]:
        base = _build(config, device, dtype)
        generator = torch.Generator(device).manual_seed(batch)
        prompt = torch.randint(1, config.vocab_size, (batch, args.prompt), device=device, generator=generator)
        gen_kwargs = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": args.new_tokens,
                      "min_new_tokens": args.new_tokens, "do_sample": False}

        def generate(model, kwargs, tokens=None):
            with torch.no_grad():
                out = model.generate(prompt, **{**gen_kwargs, **({} if tokens is None else {
                    "max_new_tokens": tokens, "min_new_tokens": tokens})}, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            return out[:, args.prompt:]

        built, first, reference = {}, {}, None
        for name, make in _rows(base, names, batch).items():
            start = time.perf_counter()
            # One user process runs one of these paths: none may inherit the dims Dynamo saw vary under another
            # (the CompileConfig row, built after the drop-in row, traced a more dynamic graph that never replayed
            # its FULL graph: 13 ms/token against 2.7 alone).
            vgc._compat.forget_size_history()
            try:
                model, kwargs = make()
                with vgc.counters.delta() as cold:
                    tokens = generate(model, kwargs)
            except Exception as error:   # noqa: BLE001 - a row that fails is reported; the others still run
                failed.setdefault(str(batch), {})[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                print(f"  batch {batch} {name}: FAILED ({failed[str(batch)][name]})", flush=True)
                torch.compiler.reset()
                continue
            first[name] = {"seconds": time.perf_counter() - start, "tokens": tokens,
                           "inductor_compiles": cold["inductor_compiles"]}
            reference = tokens if name == "eager" else reference
            built[name] = (model, kwargs)
            print(f"  batch {batch} {name}: first generate() {first[name]['seconds']:.2f} s", flush=True)
        samples = {name: [] for name in built}
        one_token = {name: [] for name in built}
        counted = {name: {} for name in built}
        for _ in range(args.reps):   # interleaved: drift in the host or the GPU falls on every row alike
            for name, (model, kwargs) in built.items():
                with vgc.counters.delta() as d:
                    start = time.perf_counter()
                    generate(model, kwargs)
                    samples[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                generate(model, kwargs, tokens=1)
                one_token[name].append(time.perf_counter() - start)
                for key in ("dynamo_traces", "inductor_compiles", "cudagraph_replays", "cudagraph_captures",
                            "eager_runs"):
                    counted[name][key] = counted[name].get(key, 0) + d[key]
        forward_ms, host_us, kernels = {}, {}, {}
        for name, (model, kwargs) in built.items():
            if name.startswith("vgc integration") and device == "cuda":
                forward_ms[name], host_us[name], kernels[name] = _decode_graph_ms(model, batch)
                continue
            timer = _install_timer(name, model)
            if timer is not None:
                timer.on = True
                generate(model, kwargs)
                forward_ms[name], host_us[name] = timer.take()
        for name in built:
            seconds = statistics.median(samples[name])
            tokens = first[name]["tokens"]
            same = (tokens == reference).all(0).long()
            leading = int(same.cumprod(0).sum())
            results.setdefault(str(batch), {})[name] = {
                "first_s": first[name]["seconds"], "tok_s": batch * args.new_tokens / seconds,
                "ms_per_token": 1000 * seconds / args.new_tokens, "spread_s": [min(samples[name]), max(samples[name])],
                "ms_per_later_token": 1000 * (seconds - statistics.median(one_token[name]))
                / max(1, args.new_tokens - 1),
                "decode_forward_ms": forward_ms.get(name), "decode_host_us": host_us.get(name),
                "decode_kernels": kernels.get(name),
                "leading_tokens_equal_eager": leading,
                "after_first": counted[name]}
        del built
        # Each batch's table as soon as it is done (and the JSON so far): a run cut short keeps what it measured.
        _report(args, dtype, device, {str(batch): results.get(str(batch), {})},
                {str(batch): failed.get(str(batch), {})})
        if args.json:
            _write_json(args, device, results, failed)

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
