"""`vgc bench encoder`: request latency of a Qwen2-VL-shaped vision encoder, every execution strategy in one run.

`--model qwen2_vl` is vgc's reference ViT at Qwen2-VL's shape; `--model hf-qwen2-vl` is transformers' own
`Qwen2VisionTransformerPretrainedModel` (random weights, Qwen2-VL's vision config, SDPA, bf16) served through
vgc's shipped adapter (`vgc.integrations.transformers.encoder_manager`); its eager row is the tower's own forward
and its compile rows compile that forward. `tiny` and `hf-tiny` are the same at a CPU-sized width.

Scenarios (request lists drawn from `--seed`; a request is the mm_kwargs of its images and videos):
  a  chat: 1-2 images, square-ish, 224^2-672^2 (70% up to 448^2)
  b  heavy: 1-4 images, 224^2-1344^2
  c  20 images of 336^2
  d  two-tower stream (`vgc.models.two_tower`): 1-2 images, each with 0-9 local crops
  e  mixed: 1-2 images 224^2-672^2 plus one video of 8-32 frames at 336^2 or 448^2
Sides are multiples of 28 (patch 14 x merge 2); `--model tiny` scales them to its own patch and merge, so its
token counts are the full model's.

Rows: the model's eager path; torch.compile(dynamic=True) of it, Inductor default and mode="reduce-overhead";
`EncoderCudaGraphManager` without graphs, with graphs at its auto budgets, at the seed's powers of two and at
linear steps of 512 tokens. One process, one model instance; each manager captures once and serves every
scenario of its model. Each request is timed alone: synchronize, run, synchronize.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import math
import os
import random
import shlex
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch

ROWS = ("eager", "compile-default", "compile-reduce-overhead", "vgc-nograph", "vgc-graphs", "vgc-graphs-pow2",
        "vgc-graphs-linear", "vgc-graphs-profile")
GRAPH_ROWS = ("vgc-graphs", "vgc-graphs-pow2", "vgc-graphs-linear", "vgc-graphs-profile")
PROFILE_ROW = "vgc-graphs-profile"   # budgets chosen from a profile of the same scenario drawn with another seed
COMPILE_MODES = {"compile-default": None, "compile-reduce-overhead": "reduce-overhead"}
SCENARIOS = {
    "a": "chat: 1-2 images 224^2-672^2 (70% <= 448^2)",
    "b": "heavy: 1-4 images 224^2-1344^2",
    "c": "20 images of 336^2",
    "d": "two-tower: 1-2 images, 0-9 local crops each",
    "e": "mixed: 1-2 images 224^2-672^2 + one video of 8-32 frames at 336^2/448^2",
}
SMALL_SCENARIOS = ("c", "d", "e")   # heavier or slower per request: --requests-small of them
LINEAR_STEP = 512                   # vgc-graphs-linear: the budgets' step (full-size models)
TWO_TOWER_NAMES = ("tiny_config", "bench_config", "TwoTowerEncoder", "make_images")


class Skip(Exception):
    """A scenario or row that cannot run here; its message says why."""


# ---- requests ----
def _squareish(rng: random.Random, lo: int, hi: int, base: int) -> tuple[int, int]:
    """(height, width) in merge windows (28 pixels at full size): `base` tall, width within 0.8-1.25x."""
    return base, min(hi, max(lo, round(base * rng.uniform(0.8, 1.25))))


def _chat_side(rng: random.Random) -> tuple[int, int]:
    base = rng.randint(8, 16) if rng.random() < 0.7 else rng.randint(16, 24)   # 224-448 px / 448-672 px
    return _squareish(rng, 8, 24, base)


def _vit_layouts(scenario: str, count: int, seed: int) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Per request: the items' (height, width) in 28-pixel windows and their frames (1: an image)."""
    rng = random.Random(f"{seed}/{scenario}")
    layouts = []
    for _ in range(count):
        if scenario == "a":
            sides = [_chat_side(rng) for _ in range(rng.randint(1, 2))]
        elif scenario == "b":
            sides = [_squareish(rng, 8, 48, rng.randint(8, 48)) for _ in range(rng.randint(1, 4))]
        elif scenario == "c":
            sides = [(12, 12)] * 20
        elif scenario == "e":
            sides = [_squareish(rng, 8, 24, rng.randint(8, 24)) for _ in range(rng.randint(1, 2))]
        else:
            raise ValueError(f"no ViT layout for scenario {scenario!r}")
        frames = [1] * len(sides)
        if scenario == "e":   # one video of 8-32 frames (even: two frames per temporal patch) among the images
            video = rng.choice((12, 16))
            at = rng.randint(0, len(sides))
            sides.insert(at, (video, video))
            frames.insert(at, 2 * rng.randint(4, 16))
        layouts.append((sides, frames))
    return layouts


def _vit_request(vit, cfg, windows: list[tuple[int, int]], frames: list[int], device: torch.device,
                 seed: int) -> dict:
    unit = cfg.patch_size * cfg.merge
    sides = [(h * unit, w * unit) for h, w in windows]
    if device.type != "cuda":
        return vit.make_images(cfg, sides, frames=frames, device=device, seed=seed)
    # make_images draws the pixels on the CPU (billions of samples for the default scenarios): take its grids from
    # a zero-channel copy of the config and draw the pixels on the device.
    grids = vit.make_images(dataclasses.replace(cfg, in_channels=0), sides, frames=frames, seed=seed)
    patches = grids["pixel_values"].shape[0]
    generator = torch.Generator(device=device).manual_seed(seed)
    pixels = torch.randn(patches, cfg.patch_dim, generator=generator, device=device, dtype=cfg.dtype)
    return {"pixel_values": pixels, "grid_thw": grids["grid_thw"]}   # on the CPU, as make_images leaves it


def _two_tower_crops(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(f"{seed}/d")
    return [[rng.randint(0, 9) for _ in range(rng.randint(1, 2))] for _ in range(count)]


# ---- models and rows ----
def _vit_config(vit, name: str):
    if name not in ("tiny", "hf-tiny"):
        return vit.qwen2_vl_vit_config()
    # The tiny model (narrow, 2 layers, 8-pixel patches) with the full model's geometry: the scaled scenarios then
    # have the full model's token counts, budgets and frames per sequence. tiny_vit_config's own limits (128^2
    # frames, 256 tokens) would send most items eagerly past every budget, and on CUDA its attention `max_seqlen`
    # would be shorter than the frames.
    cfg, full = vit.tiny_vit_config(), vit.qwen2_vl_vit_config()
    scale = (cfg.patch_size * cfg.merge) / (full.patch_size * full.merge)
    return dataclasses.replace(cfg, temporal_patch=full.temporal_patch,
                               min_pixels=round(math.isqrt(full.min_pixels) * scale) ** 2,
                               max_pixels=round(math.isqrt(full.max_pixels) * scale) ** 2,
                               max_frames_per_video=full.max_frames_per_video,
                               max_batch_tokens=full.max_batch_tokens)


def _two_tower(model_name: str, device: torch.device):
    """(module, config, model, full-size largest budget) of the two-tower encoder, or Skip with the reason."""
    try:
        two_tower = importlib.import_module("vgc.models.two_tower")
    except ModuleNotFoundError as error:   # not written yet: the other scenarios still run
        raise Skip(f"no module vgc.models.two_tower ({error})") from error
    except Exception as error:   # broken
        raise Skip(f"vgc.models.two_tower does not import ({type(error).__name__}: {error})") from error
    missing = [n for n in TWO_TOWER_NAMES if not hasattr(two_tower, n)]
    if missing:
        raise Skip(f"vgc.models.two_tower lacks {', '.join(missing)}")
    try:
        cfg = two_tower.tiny_config() if model_name == "tiny" else two_tower.bench_config()
        model = two_tower.TwoTowerEncoder(cfg).to(device).eval()
    except Exception as error:
        raise Skip(f"two_tower.TwoTowerEncoder could not be built ({type(error).__name__}: {error})") from error
    full = two_tower.bench_config()
    full_largest = getattr(full, "max_images_per_batch", 0) * getattr(full, "global_tokens", 0)
    return two_tower, cfg, model, full_largest or model.get_encoder_cudagraph_budget_range(None)[1]


def _hf_qwen2_vl(cfg, device: torch.device):
    """transformers' Qwen2-VL vision tower at `cfg`'s geometry (the full model's vision config unless tiny), random
    weights, SDPA, behind vgc's shipped adapter."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    from vgc.integrations.transformers import vision_adapter

    tower_config = Qwen2VLVisionConfig(depth=cfg.depth, embed_dim=cfg.dim, hidden_size=cfg.out_hidden,
                                       num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim // cfg.dim,
                                       patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch,
                                       in_channels=cfg.in_channels, spatial_merge_size=cfg.merge)
    tower_config._attn_implementation = "sdpa"
    torch.manual_seed(cfg.seed)
    with torch.device(device):
        tower = Qwen2VisionTransformerPretrainedModel(tower_config)
    tower = tower.to(cfg.dtype).eval()
    # the processor's smallest image (56^2 pixels, 4 tokens), scaled to the patch size like the scenarios
    side = 56 * cfg.patch_size // 14
    return vision_adapter(tower, max_frame_pixels=cfg.max_pixels, min_pixels=side * side,
                          max_batch_tokens=cfg.max_batch_tokens, max_frames_per_video=cfg.max_frames_per_video)


def _per_item(model, output, mm_kwargs: dict) -> list[torch.Tensor]:
    if isinstance(output, (list, tuple)):
        return list(output)
    from vgc.encoder.protocol import split_by_tokens

    return split_by_tokens(output, model.get_encoder_cudagraph_item_specs(mm_kwargs))


def _linear_budgets(smallest: int, largest: int, full_largest: int) -> list[int]:
    """Steps of 512 tokens up to the largest budget; for a tiny model whose range is smaller than its full-size
    counterpart's (`full_largest`), a proportionally smaller step. Each step is a multiple of the smallest budget."""
    step = LINEAR_STEP * min(1.0, largest / full_largest)
    step = max(smallest, round(step / smallest) * smallest)
    return sorted({*range(step, largest, step), largest})


def _budgets(row: str, model, full_largest: int) -> list[int]:
    import vgc
    from vgc.encoder.pack import budget_levels

    smallest, largest = model.get_encoder_cudagraph_budget_range(vgc.CompilationConfig())
    if row == "vgc-graphs-pow2":
        return budget_levels(smallest, largest, growth=2.0)
    if row == "vgc-graphs-linear":
        return _linear_budgets(smallest, largest, full_largest)
    return []   # auto


def _path_forward(model, path: str) -> Callable:
    def forward(inputs):
        return model.encoder_cudagraph_forward(inputs, path=path)
    return forward


def _compiled_paths(model, mode: str | None) -> Callable[[dict], list[torch.Tensor]]:
    """A multi-path model's eager path with each path's forward compiled: every path's buffers at the batch's own
    size, the path's forward, the model's post-processing (what the two-tower model's own forward does). Compiling
    `model(**mm_kwargs)` whole would break the graph at its host-side crop counts and recompile per crop layout."""
    from vgc.encoder.protocol import DEFAULT_PATH, GLOBAL_PATH, LOCAL_PATH

    paths = model.get_encoder_cudagraph_config().paths()
    compiled = {p: torch.compile(_path_forward(model, p), dynamic=True, mode=mode) for p in paths}

    def run(mm_kwargs: dict) -> list[torch.Tensor]:
        specs = model.get_encoder_cudagraph_item_specs(mm_kwargs)
        outputs = {}
        for path in paths:
            if not sum(s.path_tokens(path) for s in specs):
                outputs[path] = None
                continue
            values = model.prepare_encoder_cudagraph_replay_buffers(mm_kwargs, len(specs), sum(s.frames for s in specs),
                                                                    path=path).values
            outputs[path] = compiled[path]({k: v for k, v in values.items() if v is not None})
        main = outputs.get(DEFAULT_PATH, outputs.get(GLOBAL_PATH))
        return model.postprocess_encoder_output(main, mm_kwargs, specs, local_output=outputs.get(LOCAL_PATH))
    return run


def _build(row: str, kind: str, model, full_largest: int, profile: str | None = None
           ) -> tuple[Callable[[dict], Any], dict]:
    """The row's `run(mm_kwargs)` for `model` and what it cost to set up (vgc rows: the manager's numbers;
    `profile`: the traffic profile the profile row chooses its budgets from)."""
    import vgc
    from vgc.encoder import EncoderCudaGraphManager

    info: dict[str, Any] = {}
    if row == "eager":
        return (lambda kw: model(**kw)), info
    if row in COMPILE_MODES:
        mode = COMPILE_MODES[row]
        if kind == "vit":   # the eager path, inputs built at the batch's own size (what model.forward does)
            compiled = torch.compile(lambda inputs: model.encoder_cudagraph_forward(inputs), dynamic=True, mode=mode)
            return (lambda kw: compiled(model._inputs(kw))), info
        if kind == "hf":   # the tower's own forward, compiled as a user would
            compiled = torch.compile(lambda pixels, grid: model(pixels, grid), dynamic=True, mode=mode)
            return (lambda kw: compiled(kw["pixel_values"], kw["grid_thw"])), info
        return _compiled_paths(model, mode), info
    budgets = _budgets(row, model, full_largest)
    config = vgc.CompilationConfig(cudagraph_mm_encoder=row != "vgc-nograph", encoder_cudagraph_token_budgets=budgets,
                                   cudagraph_traffic_profile=profile)
    manager = EncoderCudaGraphManager(model, config)
    start = time.perf_counter()
    stats = manager.capture()
    info.update(manager=manager, setup_s=time.perf_counter() - start, compile_s=stats["seconds"].get("compile"),
                capture_s=stats["seconds"].get("capture", 0) + stats["seconds"].get("calibrate", 0),
                budgets=stats["budgets"],
                graphs=sum(len(b) for b in stats["captured"].values()),
                graph_memory_bytes=sum(sum(m.values()) for m in stats["graph_memory_bytes"].values()))
    return manager.execute, info


def _record_profile(model, requests: list[dict], path: str) -> str:
    """A traffic profile of `requests` as the default manager packs them (`EncoderCudaGraphManager.record`)."""
    import vgc
    from vgc.encoder import EncoderCudaGraphManager

    recorder = EncoderCudaGraphManager(model, vgc.CompilationConfig(cudagraph_mm_encoder=False), compile=False,
                                       record=path)
    for mm in requests:
        recorder.record(mm)
    recorder.recorder.flush()
    return path


def _graph_totals(stats: dict) -> tuple[int, int, int, int]:
    """(path runs replayed, all path runs, budget tokens replayed, padding tokens among them) so far."""
    runs = stats["path_items"].values()
    return (sum(r["replayed"] for r in runs), sum(sum(r.values()) for r in runs), stats["tokens"]["replayed"],
            stats["tokens"]["padded"])


# ---- timing ----
def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _max_diff(items: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    if len(items) != len(reference):
        return math.inf
    diff = 0.0
    for got, want in zip(items, reference):
        if got.shape != want.shape:
            return math.inf
        if got.numel():
            diff = max(diff, (got.float() - want.float()).abs().max().item())
    return diff


def _measure(row: str, run, info: dict, model, requests: list[dict], reference: list[torch.Tensor],
             warmup: int, sync) -> dict:
    manager = info.get("manager")
    graphs = row in GRAPH_ROWS
    untimed = {"compile-default": 1, "compile-reduce-overhead": 2}.get(row, 0)
    start = time.perf_counter()
    with torch.no_grad():
        for kw in (requests * untimed if untimed else requests[:warmup]):
            run(kw)
        sync()
        untimed_s = time.perf_counter() - start
        before = _graph_totals(manager.stats()) if graphs else None
        latencies, diff = [], None
        for i, kw in enumerate(requests):
            sync()
            t0 = time.perf_counter()
            out = run(kw)
            sync()
            latencies.append((time.perf_counter() - t0) * 1e3)
            if i == 0:   # before the next call: reduce-overhead outputs live in static buffers
                diff = _max_diff(_per_item(model, out, kw), reference)
            del out
    largest = max((r.float().abs().max().item() for r in reference if r.numel()), default=0.0)
    result = {"mean_ms": sum(latencies) / len(latencies), "p50_ms": _percentile(latencies, 50),
              "p99_ms": _percentile(latencies, 99), "untimed_s": untimed_s, "max_abs_diff": diff,
              "max_abs_reference": largest, "latencies_ms": latencies}
    if manager is not None:
        result.update({k: info[k] for k in ("compile_s", "capture_s", "graphs", "graph_memory_bytes", "budgets")})
        result["setup_s"] = info["setup_s"]
    if graphs:
        replayed, runs, seen, padded = (a - b for a, b in zip(_graph_totals(manager.stats()), before))
        result["graph_rate"] = replayed / runs if runs else None
        result["padding_waste"] = padded / seen if seen else None
    return result


# ---- report ----
def _fmt(value, spec: str, width: int) -> str:
    if value is None:
        return f"{'-':>{width}s}"
    if isinstance(value, float) and math.isinf(value):
        return f"{'mismatch':>{width}s}"
    return f"{value:{width}{spec}}"


COLUMNS = (("mean ms", 8), ("p50 ms", 8), ("p99 ms", 8), ("vs eager", 8), ("graph %", 7), ("pad %", 5),
           ("graphs", 6), ("compile s", 9), ("capture s", 9), ("graph MiB", 9), ("untimed s", 9), ("max|diff|", 9))


def _table(name: str, scenario: dict) -> list[str]:
    lines = [f"\nscenario {name}: {SCENARIOS[name]}; {scenario.get('requests', 0)} requests"]
    if "skipped" in scenario:
        return lines + [f"  skipped: {scenario['skipped']}"]
    lines.append(f"{'row':24s}" + "".join(f"  {c:>{w}s}" for c, w in COLUMNS))
    eager = scenario["rows"].get("eager", {}).get("mean_ms")
    for row, r in scenario["rows"].items():
        if "na" in r or "error" in r:
            lines.append(f"{row:24s}  " + (f"n/a ({r['na']})" if "na" in r else f"error: {r['error']}"))
            continue
        pct = (lambda v: None if v is None else 100 * v)
        mib = r.get("graph_memory_bytes")
        cells = (_fmt(r["mean_ms"], ".3f", 8), _fmt(r["p50_ms"], ".3f", 8), _fmt(r["p99_ms"], ".3f", 8),
                 (f"{eager / r['mean_ms']:7.2f}x" if eager else _fmt(None, "", 8)),
                 _fmt(pct(r.get("graph_rate")), ".1f", 7), _fmt(pct(r.get("padding_waste")), ".1f", 5),
                 _fmt(r.get("graphs") if row in GRAPH_ROWS else None, "d", 6), _fmt(r.get("compile_s"), ".1f", 9),
                 _fmt(r.get("capture_s") if row in GRAPH_ROWS else None, ".1f", 9),
                 _fmt(None if mib is None or row not in GRAPH_ROWS else mib / 2 ** 20, ".0f", 9),
                 _fmt(r["untimed_s"], ".1f", 9), _fmt(r["max_abs_diff"], ".2e", 9))
        lines.append(f"{row:24s}" + "".join(f"  {c}" for c in cells))
    return lines


NOTES = """
notes: each request timed alone (synchronize, run, synchronize); mean/p50/p99 over the timed requests.
  Untimed first: eager and vgc rows the first --warmup requests; compile-default the whole request list once and
  compile-reduce-overhead twice (cudagraph trees warm a new shape up on its first call and record it on the
  second), so compiles, recompiles and recordings per new shape are excluded (their cost is in "untimed s").
  compile rows: torch.compile(dynamic=True) of the model's forward over its buffers at the batch's own size
  (two-tower: each tower's), buffers built per request as the eager path builds them; hf-*: of the tower's own
  forward (what a user of transformers would compile), whose eager row is that forward too.
  vs eager = eager mean / row mean (>1: faster). graph % = items served by graph replays (per path; the rest ran
  the compiled forward at their own size, where the padding costs more than the graph saves, or eagerly, over
  every budget), pad % = padding tokens / replayed budget tokens, both over the timed requests. compile s,
  capture s: the manager's capture(), capture including the timing of graphs against the compiled forward (a
  later manager of the same model may load the compile from vgc's compile cache); graph MiB = pool growth summed over
  its graphs. A manager captures once per model and serves every scenario of it (vgc-graphs-profile: one per
  scenario, its budgets chosen from a traffic profile of the same scenario drawn with seed + 1, recorded by
  EncoderCudaGraphManager.record as the auto budgets pack it, at most cudagraph_max_graphs=16). max|diff| = the first
  request's per-item outputs vs eager (bf16: ~1e-2 expected); never fails the run."""


def _row_on(row: str, kind: str, model, full_largest: int, built: dict, work: dict, warmup: int, sync) -> dict:
    """One row on one scenario; the row's function or manager is built on its model's first scenario and kept in
    `built` (the profile row: one per scenario, from that scenario's profile). A failure is reported in the result
    (and its traceback on stderr), never raised."""
    key = kind if row != PROFILE_ROW else (kind, work["profile"])
    try:
        if key not in built:
            try:
                built[key] = _build(row, kind, model, full_largest, work.get("profile") if row == PROFILE_ROW
                                    else None)
            except Exception as error:
                built[key] = f"{type(error).__name__}: {str(error)[:200]}"   # later scenarios of this model
                raise
        if isinstance(built[key], str):
            return {"error": built[key]}
        run, info = built[key]
        return _measure(row, run, info, model, work["requests"], work["reference"], warmup, sync)
    except Exception as error:
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}


def _command_line() -> str:
    argv0 = sys.argv[0] if sys.argv else "vgc"
    head = "python -m vgc" if argv0.endswith("__main__.py") else os.path.basename(argv0)
    return " ".join([head, shlex.join(sys.argv[1:])]).strip()


def _release() -> None:
    gc.collect()
    torch.compiler.reset()   # dynamo's caches and cudagraph trees: the next row compiles afresh
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vgc bench encoder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["qwen2_vl", "tiny", "hf-qwen2-vl", "hf-tiny"], default="qwen2_vl",
                        help="qwen2_vl: vgc's ViT at Qwen2-VL's vision shape, bf16, CUDA; hf-qwen2-vl: transformers' "
                        "Qwen2-VL vision tower through vgc's adapter, bf16, CUDA; tiny, hf-tiny: run on the CPU too "
                        "(default: %(default)s)")
    parser.add_argument("--requests", type=int, help="requests of scenarios a, b (default: 300 on CUDA, 6 on the "
                        "CPU)")
    parser.add_argument("--requests-small", type=int, help="requests of scenarios c, d, e, at most --requests "
                        "(default: 100 on CUDA, --requests on the CPU)")
    parser.add_argument("--warmup", type=int, help="untimed requests first, eager and vgc rows (default: 20 on "
                        "CUDA, 2 on the CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scenarios' request lists (default: "
                                                            "%(default)s)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of "
                        f"{', '.join(SCENARIOS)} (default: %(default)s)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of rows: {', '.join(ROWS)} (default: "
                                                   "all)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="where the model runs (default: cuda when "
                                                                  "available)")
    parser.add_argument("--json", help="also write every number (per-request latencies too) to this file (default: "
                                       "none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from vgc.models import vit

    parser = build_parser()
    args = parser.parse_args(argv)

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    rows = [r.strip() for r in args.only.split(",") if r.strip()] or list(ROWS)
    for bad, known, what in ((set(scenarios) - set(SCENARIOS), SCENARIOS, "scenario"),
                             (set(rows) - set(ROWS), ROWS, "row")):
        if bad:
            parser.error(f"unknown {what}(s) {', '.join(sorted(bad))}; known: {', '.join(known)}")
    rows = [r for r in ROWS if r in rows]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_cuda = device.type == "cuda"
    for name, cuda_default, cpu_default in (("requests", 300, 6), ("requests_small", 100, args.requests or 6),
                                            ("warmup", 20, 2)):
        if getattr(args, name) is None:
            setattr(args, name, cuda_default if on_cuda else cpu_default)
    if args.requests < 1 or args.requests_small < 1 or args.warmup < 0:
        parser.error("--requests and --requests-small must be >= 1, --warmup >= 0")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("vgc bench encoder: --device cuda but CUDA is not available")
    if device.type != "cuda" and not args.model.endswith("tiny"):
        raise SystemExit(f"vgc bench encoder: --model {args.model} needs a CUDA device; use --model tiny or hf-tiny "
                         "on the CPU")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    from vgc import cuda_runtime

    graphs_ok = cuda_runtime.graphs_supported(device)
    unavailable = {r: "needs CUDA" for r in rows if (r in GRAPH_ROWS and not graphs_ok)
                   or (r == "compile-reduce-overhead" and device.type != "cuda")}

    # ---- models and requests (built once; every row sees the same tensors) ----
    cfg = _vit_config(vit, args.model)
    hf = args.model.startswith("hf-")
    if hf:
        packed_model = _hf_qwen2_vl(cfg, device)
    else:
        with torch.device(device):   # 0.6 B parameters: initialised where they will live
            packed_model = vit.VisionEncoder(cfg)
        packed_model = packed_model.to(device).eval()
    packed = "hf" if hf else "vit"   # the kind of model the packed-patch scenarios (all but d) run on
    models: dict[str, Any] = {packed: packed_model}
    full_largest = {packed: vit.qwen2_vl_vit_config().max_batch_tokens}
    work: dict[str, dict] = {}   # scenario -> {kind, requests, reference, profile}
    profile_dir = tempfile.mkdtemp(prefix="vgc-bench-encoder-profiles-")
    results: dict[str, dict] = {}
    start = time.perf_counter()

    def make_requests(s: str, kind: str, count: int, seed: int) -> list[dict]:
        if kind == "two_tower":
            return [two_tower.make_images(tt_cfg, crops, device=device, seed=seed * 1_000_003 + i)
                    for i, crops in enumerate(_two_tower_crops(count, seed))]
        return [_vit_request(vit, cfg, windows, frames, device, seed=seed * 1_000_003 + i)
                for i, (windows, frames) in enumerate(_vit_layouts(s, count, seed))]

    for s in scenarios:
        count = min(args.requests, args.requests_small) if s in SMALL_SCENARIOS else args.requests
        results[s] = {"description": SCENARIOS[s], "requests": count, "rows": {}}
        if s == "d" and hf:
            results[s]["skipped"] = "the two-tower scenario runs on --model qwen2_vl or tiny"
            continue
        if s == "d":
            try:
                two_tower, tt_cfg, tt_model, full_largest["two_tower"] = _two_tower(args.model, device)
                models["two_tower"] = tt_model
                requests = make_requests(s, "two_tower", count, args.seed)
            except Skip as reason:
                results[s]["skipped"] = str(reason)
                continue
            except Exception as error:   # make_images with other names or arguments than planned
                results[s]["skipped"] = f"two_tower.make_images failed ({type(error).__name__}: {error})"
                continue
            kind = "two_tower"
        else:
            kind = packed
            requests = make_requests(s, kind, count, args.seed)
        with torch.no_grad():
            try:
                reference = [t.clone() for t in _per_item(models[kind], models[kind](**requests[0]), requests[0])]
            except Exception as error:
                results[s]["skipped"] = f"eager reference failed ({type(error).__name__}: {error})"
                continue
        work[s] = {"kind": kind, "requests": requests, "reference": reference}
        if PROFILE_ROW in rows:   # the profile row's traffic: the same scenario, drawn with another seed
            work[s]["profile"] = _record_profile(models[kind], make_requests(s, kind, count, args.seed + 1),
                                                 os.path.join(profile_dir, f"{s}.json"))
    sync()
    print(f"vgc bench encoder: {args.model} on {device}, requests ready in {time.perf_counter() - start:.1f} s",
          flush=True)

    # ---- rows: each builds its compiled function or manager once per model and serves every scenario ----
    for row in rows:
        built: dict[str, Any] = {}
        row_start = time.perf_counter()
        for s in scenarios:
            if s not in work:
                continue
            if row in unavailable:
                results[s]["rows"][row] = {"na": unavailable[row]}
                continue
            kind = work[s]["kind"]
            r = _row_on(row, kind, models[kind], full_largest[kind], built, work[s], args.warmup, sync)
            results[s]["rows"][row] = r
            if "error" not in r:
                graphs = (f", graph {100 * r['graph_rate']:.0f}%, pad {100 * (r['padding_waste'] or 0):.1f}%, "
                          f"capture {r['capture_s']:.1f} s") if r.get("graph_rate") is not None else ""
                print(f"  [{s}] {row}: mean {r['mean_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, untimed "
                      f"{r['untimed_s']:.1f} s, max|diff| {r['max_abs_diff']:.2e} (largest |eager| "
                      f"{r['max_abs_reference']:.2f}){graphs}", flush=True)
        built.clear()
        _release()
        if row not in unavailable:
            print(f"  {row} done in {time.perf_counter() - row_start:.0f} s ({time.perf_counter() - start:.0f} s "
                  "so far)", flush=True)

    # ---- report ----
    for s in scenarios:
        print("\n".join(_table(s, results[s])))
    print(NOTES)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({torch.get_num_threads()} threads)"
    date = time.strftime("%Y-%m-%d %H:%M")
    print(f"\nvgc bench encoder: model {args.model}, torch {torch.__version__}, {device_name}, {date}, "
          f"total {time.perf_counter() - start:.0f} s; command: {_command_line()}")
    if args.json:
        payload = {"model": args.model, "torch": torch.__version__, "device": device_name, "date": date,
                   "command": _command_line(), "args": vars(args), "scenarios": results}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
