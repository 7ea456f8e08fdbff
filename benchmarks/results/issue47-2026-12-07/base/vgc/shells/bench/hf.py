"""`vgc bench hf`: unmodified Hugging Face transformers models under every execution strategy, in one run.

Models (random weights, bf16, built on the GPU): `llama`, a `LlamaModel` shaped like Llama-3.2-1B (16 layers,
hidden 2048, 32/8 heads), run on whole sequences without a KV cache; `vit`, a `ViTModel` shaped like ViT-L/16
(24 layers, hidden 1024, 224x224 images). Both use SDPA attention, which the vgc rows split at.

Rows: eager, torch.compile (inductor default), torch.compile mode="reduce-overhead", and drop-in
torch.compile(backend="vgc") with cudagraph_mode NONE / PIECEWISE / FULL / FULL_AND_PIECEWISE split at SDPA, and
FULL with `splitting_ops=[]` ("one piece": Inductor compiles attention too, as reduce-overhead does), drop-in
FULL_AND_PIECEWISE with eager pieces (no Inductor), and breakable graphs (`vgc.cudagraph.breakable`: no Dynamo,
no Inductor; captured at each shape's first call, SDPA eager between segments); with
`--passes`, each vgc row has a "+ passes" twin with every built-in graph pass on (`vgc.passes`), on a copy of the
model, timed interleaved with its plain row (5 alternating chunks), and the table compares the two. Each model is
compiled once per row and called at every shape in turn (Dynamo compiles the first shape static and the next one
with symbolic sizes, as for any user). Each cell is the median of `--steps` calls timed with CUDA events after
`--warmup` untimed calls (graphs are captured during those).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from vgc.shells.bench.timing import add_row_flags, print_pass_speedups, row_groups, time_interleaved, with_pass_twins

SPLIT_AT_SDPA = ["aten::scaled_dot_product_attention"]


def _llama(layers: int | None):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers or 16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, rope_theta=500000.0,
        attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.LlamaModel(config).to(torch.bfloat16).eval()

    def batch(shape: str) -> dict:
        b, t = (int(x) for x in shape.split("x"))
        generator = torch.Generator("cuda").manual_seed(0)
        return {"input_ids": torch.randint(0, config.vocab_size, (b, t), device="cuda", generator=generator),
                "use_cache": False}
    return model, batch


def _vit(layers: int | None):
    import transformers

    config = transformers.ViTConfig(hidden_size=1024, num_hidden_layers=layers or 24, num_attention_heads=16,
                                    intermediate_size=4096, image_size=224, patch_size=16,
                                    attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.ViTModel(config, add_pooling_layer=False).to(torch.bfloat16).eval()

    def batch(shape: str) -> dict:
        generator = torch.Generator("cuda").manual_seed(0)
        return {"pixel_values": torch.randn(int(shape), 3, 224, 224, device="cuda", dtype=torch.bfloat16,
                                            generator=generator)}
    return model, batch


MODELS = {"llama": (_llama, "1x16,4x128"), "vit": (_vit, "1,8,32")}


ROWS = ("eager", "inductor default", "inductor reduce-overhead", "drop-in NONE", "drop-in PIECEWISE", "drop-in FULL",
        "drop-in FULL, one piece", "drop-in FULL_AND_PIECEWISE", "drop-in F&P eager pieces", "breakable")
"""The rows main() builds, in order: what --only accepts, known before a model is built."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgc bench hf",
        description="Latency of unmodified transformers models (a Llama-3.2-1B-shaped LlamaModel, a ViT-L/16-shaped "
                    "ViTModel) under every execution strategy: eager, torch.compile, drop-in "
                    "torch.compile(backend=\"vgc\") in each cudagraph mode, breakable graphs. Needs CUDA.")
    parser.add_argument("--model", choices=sorted(MODELS), default="llama",
                        help="the transformers model to run (default: %(default)s)")
    parser.add_argument("--shapes", help="comma-separated shapes: BxT for llama (default: "
                                         f"{MODELS['llama'][1]}), batch sizes for vit (default: {MODELS['vit'][1]})")
    parser.add_argument("--layers", type=int, help="fewer layers than the real shape, for quick runs (default: the "
                                                   "real shape's)")
    add_row_flags(parser, ROWS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("vgc bench hf needs a CUDA device")
    import vgc  # registers the "vgc" backend

    build_model, default_shapes = MODELS[args.model]
    model, make_batch = build_model(args.layers)
    shapes = (args.shapes or default_shapes).split(",")

    from vgc.passes import BUILTIN_PASSES

    def dropin(mode: str, splitting_ops=SPLIT_AT_SDPA, passes=False):
        options = {"cudagraph_mode": mode, "splitting_ops": splitting_ops,
                   "pass_config": {name: passes for name in BUILTIN_PASSES}}
        # The twin with passes runs on a copy: the fusion rebinds the weights, and the plain row runs beside it.
        return torch.compile(copy.deepcopy(model) if passes else model, backend="vgc", options=options)

    def breakable_graphs():
        # one set of breakable graphs per input shape, captured at its first call (as drop-in captures on demand)
        from vgc.cudagraph import breakable

        name = next(iter(make_batch(shapes[0])))
        dim = 1 if args.model == "llama" else 0   # tokens of a [batch, tokens] sequence; images of a batch
        by_shape: dict = {}

        def call(**batch):
            key = tuple(batch[name].shape)
            graphs = by_shape.get(key)
            if graphs is None:
                graphs = by_shape[key] = breakable(model, dynamic_arg_dims={name: dim},
                                                   capture_sizes=[batch[name].shape[dim]])
                graphs.warmup(lambda n: batch)
            return graphs(**batch)
        return call

    rows = {
        "eager": lambda: model,
        "inductor default": lambda: torch.compile(model),
        "inductor reduce-overhead": lambda: torch.compile(model, mode="reduce-overhead"),
        "drop-in NONE": lambda: dropin("none"),
        "drop-in PIECEWISE": lambda: dropin("piecewise"),
        "drop-in FULL": lambda: dropin("full"),
        "drop-in FULL, one piece": lambda: dropin("full", splitting_ops=[]),
        "drop-in FULL_AND_PIECEWISE": lambda: dropin("full_and_piecewise"),
        "drop-in F&P eager pieces": lambda: torch.compile(model, backend="vgc", options={
            "cudagraph_mode": "full_and_piecewise", "splitting_ops": SPLIT_AT_SDPA, "piece_backend": "eager"}),
        "breakable": breakable_graphs,
    }
    assert tuple(rows) == ROWS, "ROWS (what --only accepts) must name the rows built here, in order"
    if args.passes:
        rows = with_pass_twins(rows, {
            "drop-in NONE": lambda: dropin("none", passes=True),
            "drop-in PIECEWISE": lambda: dropin("piecewise", passes=True),
            "drop-in FULL": lambda: dropin("full", passes=True),
            "drop-in FULL, one piece": lambda: dropin("full", splitting_ops=[], passes=True),
            "drop-in FULL_AND_PIECEWISE": lambda: dropin("full_and_piecewise", passes=True)})
    results, reference = {}, {}
    for group in row_groups(rows, args.only):
        torch.compiler.reset()
        fns, setup = {}, {}
        for name in group:
            start = time.perf_counter()
            fns[name] = rows[name]()
            setup[name] = time.perf_counter() - start
        cells = {name: {} for name in group}
        timed = {name: {} for name in group}
        differences = {name: {} for name in group}
        captures = dict.fromkeys(group, 0)
        for shape in shapes:
            batch = make_batch(shape)
            for name, fn in fns.items():
                start = time.perf_counter()
                with torch.no_grad(), vgc.counters.delta() as first:
                    out = fn(**batch)[0].float()   # untimed: compiles on first use of a shape
                torch.cuda.synchronize()
                setup[name] += time.perf_counter() - start
                captures[name] += first["cudagraph_captures"]
                differences[name][shape] = (out - reference.setdefault(shape, out)).abs().max().item()
            ms, changes = time_interleaved(list(fns.values()), batch, args.warmup, args.steps,
                                           counted=("cudagraph_captures", "cudagraph_replays", "eager_runs"))
            for name, value, change in zip(fns, ms, changes):
                cells[name][shape] = value
                captures[name] += change.pop("cudagraph_captures")
                timed[name][shape] = change   # warm-up calls included
        for name in group:
            results[name] = {"ms": cells[name], "setup_s": setup[name], "cudagraph_captures": captures[name],
                             "calls_after_the_first": timed[name], "max_abs_diff_vs_first_row": differences[name]}
            print(f"  {name}: " + ", ".join(f"{s} {v:.3f} ms" for s, v in cells[name].items())
                  + f"; {captures[name]} graphs captured, calls after the first {timed[name]}", flush=True)

    print(f"\nvgc bench hf: transformers {args.model} bf16 on {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; median of {args.steps} calls (ms)")
    print(f"{'strategy':28s}" + "".join(f"{s:>12s}" for s in shapes))
    for name, r in results.items():
        print(f"{name:28s}" + "".join(f"{r['ms'][s]:12.3f}" for s in shapes))
    for base_name in ("inductor reduce-overhead", "drop-in PIECEWISE"):
        base = results.get(base_name)
        if base:
            print(f"\nspeed-up over {base_name}:")
            for name, r in results.items():
                print(f"{name:28s}" + "".join(f"{base['ms'][s] / r['ms'][s]:11.2f}x" for s in shapes))
    print_pass_speedups(results, shapes, width=28)
    print(f"\nmax |output - first row's| ({next(iter(results), '-')}), bf16:")
    for name, r in results.items():
        print(f"{name:28s}" + "".join(f"{r['max_abs_diff_vs_first_row'][s]:12.4f}" for s in shapes))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "layers": args.layers, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                       "steps": args.steps, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
