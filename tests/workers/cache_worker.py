"""A separate process for the cache tests: compile (or load) the tiny decoder, check it, report as JSON.

usage: python cache_worker.py [--options JSON]   (cache root and format come from the environment)
"""

import argparse
import json
import logging
import sys

import torch

import vgc
from vgc.models import llama


class WarningRecorder(logging.Handler):
    """Keeps the message of every warning logged to the handler's logger (`vgc`)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--options", default="{}")
    args = parser.parse_args()
    warnings = WarningRecorder()
    logging.getLogger("vgc").addHandler(warnings)

    cfg = llama.tiny_config()
    model = llama.Llama(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig.from_options(json.loads(args.options)))
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    max_diff = 0.0
    with torch.no_grad():
        for kind in ("prefill", "decode"):
            for n in (1, 5, 16, 40):
                eager = model(**llama.make_batch(cfg, n, kind))
                out = compiled(**llama.make_batch(cfg, n, kind))
                max_diff = max(max_diff, (out - eager).abs().max().item())
    print(json.dumps({
        "counters": vgc.counters.as_dict(),
        "max_diff": max_diff,
        "cache_dirs": report["cache_dirs"],
        "seconds": report["seconds"],
        "trace_source": compiled.trace_source,
        "unusable_warnings": [m for m in warnings.messages if "unusable" in m],
        "compiler_modules": vgc._compat.compiler_modules_imported(),
    }))


if __name__ == "__main__":
    sys.exit(main())
