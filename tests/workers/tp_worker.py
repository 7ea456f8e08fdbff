"""One rank of a tensor-parallel tiny decoder: compile (or load) its shard with vgc.compile, run a few batches,
save its outputs and report as JSON.

usage: python tp_worker.py RANK WORLD_SIZE PORT OUT_DIR [--fail {trace,exit,wrong-rank}] [--options JSON] [--device D] [--live]
       [--collectives] [--dropin] [--simulated-graphs]

Ranks meet over gloo (CPU) or NCCL (`--device cuda`, rank r on GPU r). `--fail trace` makes this rank's first call
fail in the model's own code (a KV-cache list of the wrong length); `--fail exit` makes this rank die before its
first call; `--fail wrong-rank` builds another rank's shard (refused before vgc.compile). The cache root comes from the environment (VGC_CACHE_ROOT).
"""

import argparse
import json
import logging
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import vgc
from vgc.models import llama

from cache_worker import WarningRecorder   # this directory is the script's sys.path[0]

BATCHES = (("prefill", 5), ("decode", 3), ("prefill", 40), ("decode", 8))


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("rank", "world_size", "port"):
        parser.add_argument(name, type=int)
    parser.add_argument("out_dir")
    parser.add_argument("--fail", choices=["trace", "exit", "wrong-rank"])
    parser.add_argument("--options", default="{}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--live", action="store_true", help="a forward hook, so the trace is live (never saved)")
    parser.add_argument("--collectives", action="store_true", help="all-reduce over the world even with one rank")
    parser.add_argument("--dropin", action="store_true", help="torch.compile(backend='vgc') instead of vgc.compile")
    parser.add_argument("--simulated-graphs", action="store_true",
                        help="CPU tensors taken for CUDA ones, graph capture by a stand-in")
    args = parser.parse_args()
    warnings = WarningRecorder()
    logging.getLogger("vgc").addHandler(warnings)
    device = torch.device(args.device, args.rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world_size, timeout=timedelta(seconds=120))
    report = {"rank": args.rank}
    if args.simulated_graphs:
        sys.path.insert(0, str(Path(__file__).parents[1]))   # the test helpers live in tests/, one level up
        from simulated_graphs import install_simulated_capture

        install_simulated_capture()
        vgc._compat.device_from_inputs = lambda example_inputs: torch.device("cuda")
    try:
        torch.manual_seed(0)
        cfg = llama.tiny_config().sharded(args.rank, args.world_size)
        if args.fail == "wrong-rank":   # another rank's shard: refused before any weight is drawn
            cfg = llama.tiny_config().sharded((args.rank + 1) % args.world_size, args.world_size)
        with torch.device(device):
            model = llama.Llama(cfg, tp_group=dist.group.WORLD if args.collectives else None).eval()
        kv = llama.make_kv_caches(cfg, device)
        if args.live:
            model.register_forward_pre_hook(lambda module, inputs: None)
        options = json.loads(args.options)
        compiled = vgc.compile(model, config=vgc.CompilationConfig.from_options(options),
                               pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
        if args.fail == "exit":
            os._exit(3)
        make = lambda n: llama.make_batch(cfg, n, "prefill", device=device, kv_caches=kv)  # noqa: E731
        if args.fail == "trace":
            make = lambda n: {**llama.make_batch(cfg, n, "prefill", device=device), "kv_caches": kv[:1]}  # noqa
        before = vgc.counters.as_dict()
        if args.dropin:   # Dynamo's guards stay; each new shape may trace and compile again, on every rank alike
            backend = vgc.VgcBackend(vgc.CompilationConfig.from_options(options))
            compiled = torch.compile(model, backend=backend)
            compiled.trace_source = "dropin"
            compiled.stats = backend.stats
        else:
            compiled.warmup(make, make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device=device,
                                                                                kv_caches=kv))
        outputs, eager = {}, {}
        with torch.no_grad():
            for kind, n in BATCHES:
                name = f"{kind}-{n}"
                outputs[name] = compiled(**llama.make_batch(cfg, n, kind, device=device, kv_caches=kv)).clone().cpu()
                eager[name] = model(**llama.make_batch(cfg, n, kind, device=device, kv_caches=kv)).cpu()
        after = vgc.counters.as_dict()
        stats = compiled.stats()
        torch.save({"compiled": outputs, "eager": eager}, os.path.join(args.out_dir, f"rank{args.rank}.pt"))
        report.update(counters={k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)},
                      cache_dirs=stats["cache_dirs"], pieces=stats["pieces"], trace_source=compiled.trace_source,
                      cudagraphs=stats.get("cudagraphs"), error=None)
    except Exception as e:
        report.update(error="".join(traceback.format_exception(e))[-4000:], error_type=type(e).__name__)
    report["warnings"] = warnings.messages
    with open(os.path.join(args.out_dir, f"rank{args.rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
