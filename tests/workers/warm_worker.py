"""A fresh process for the warm-start tests: compile a model with `vgc.compile`, warm it up, compare with eager and
report as JSON. The model comes from a file (`--model-file`, defining `build()` and `inputs(n)`) or is the tiny
reference decoder.

usage: python warm_worker.py [--model-file PATH] [--outputs PATH] [--config JSON] [--layers N] [--device D]

The cache root comes from VGC_CACHE_ROOT; the report names the compiler modules the process imported; --outputs
saves the compiled outputs, for comparing processes exactly; --config: CompilationConfig fields.
"""

import argparse
import importlib.util
import json
import sys

import torch

import vgc
from cache_worker import WarningRecorder


def load_model_file(path: str):
    spec = importlib.util.spec_from_file_location("warm_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["warm_model"] = module   # Dynamo's trace names the module; its source is keyed by file
    spec.loader.exec_module(module)
    return module.build(), module.inputs


def tiny_decoder(layers: int | None = None, device: str = "cpu"):
    import dataclasses

    from vgc.models import llama

    cfg = llama.tiny_config() if layers is None else dataclasses.replace(llama.tiny_config(), num_layers=layers)
    return llama.Llama(cfg).to(device), lambda n: llama.make_batch(cfg, n, "prefill", device=device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-file")
    parser.add_argument("--outputs")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--layers", type=int, help="layers of the tiny decoder (default: its config's)")
    parser.add_argument("--device", default="cpu", help="where the tiny decoder runs")
    args = parser.parse_args()
    warnings = WarningRecorder()
    import logging
    logging.getLogger("vgc").addHandler(warnings)
    model, inputs = load_model_file(args.model_file) if args.model_file else tiny_decoder(args.layers, args.device)
    compiled = vgc.compile(model, config=json.loads(args.config))
    report = compiled.warmup(inputs)
    max_diff, outputs = 0.0, {}
    with torch.no_grad():
        for n in (1, 3, 16, 21):
            batch = inputs(n)
            eager = model(**batch) if isinstance(batch, dict) else model(*batch)
            out = compiled(**batch) if isinstance(batch, dict) else compiled(*batch)
            if not isinstance(out, torch.Tensor):   # a transformers model's output
                eager, out = eager.last_hidden_state, out.last_hidden_state
            max_diff = max(max_diff, (out - eager).abs().max().item())
            outputs[n] = out.clone()
    if args.outputs:
        torch.save(outputs, args.outputs)
    print(json.dumps({"counters": vgc.counters.as_dict(), "trace_source": compiled.trace_source,
                      "max_diff": max_diff, "seconds": report["seconds"], "warnings": warnings.messages,
                      "compiler_modules": vgc._compat.compiler_modules_imported()}))


if __name__ == "__main__":
    sys.exit(main())
