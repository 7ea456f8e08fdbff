"""Serve the tiny decoder from each of several cache roots in one process, as a fresh start would, and report
one JSON line per root (written before the next root starts, so a crash names its root).

usage: python fault_worker.py ROOTS_JSON OUT_JSONL

Between roots, everything a new process would not have is dropped: Dynamo's caches, Inductor's in-memory
module caches, vgc's once-per-process warnings. Kernel files loaded into the process stay mapped, which is why
faults in Inductor's own cache are also tested with real processes (tests/test_faults.py).
"""

import json
import logging
import os
import sys
import traceback

import torch

import vgc
from vgc import log
from vgc.models import llama

from cache_worker import WarningRecorder   # this directory is the script's sys.path[0]


def serve(root: str) -> dict:
    os.environ["VGC_CACHE_ROOT"] = root
    torch._dynamo.reset()
    from torch._inductor.utils import clear_caches

    clear_caches()
    log._warned.clear()
    warnings = WarningRecorder()
    logging.getLogger("vgc").addHandler(warnings)
    before = vgc.counters.as_dict()
    try:
        torch.manual_seed(0)
        cfg = llama.tiny_config()
        model = llama.Llama(cfg)
        compiled = vgc.compile(model)
        compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
        max_diff = 0.0
        with torch.no_grad():
            for kind, n in (("prefill", 5), ("decode", 3), ("prefill", 40)):
                batch = llama.make_batch(cfg, n, kind)
                max_diff = max(max_diff, (compiled(**batch) - model(**batch)).abs().max().item())
        error = None
    except Exception as e:
        max_diff, error = None, "".join(traceback.format_exception(e))[-3000:]
    finally:
        logging.getLogger("vgc").removeHandler(warnings)
    after = vgc.counters.as_dict()
    return {"root": root, "error": error, "max_diff": max_diff, "warnings": warnings.messages,
            "counters": {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}}


def main() -> None:
    roots = json.loads(open(sys.argv[1]).read())
    with open(sys.argv[2], "a") as out:
        for root in roots:
            out.write(json.dumps(serve(root)) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
