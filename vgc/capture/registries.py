"""Global registries a trace reads by key, laid out alike wherever a saved trace is captured or loaded.

transformers' models read their class's record in `_CAN_RECORD_REGISTRY` (what outputs the class can record), which
every model class built in the process joins. Dynamo guards those reads by position and by the registry's length, and
a saved program re-reads the records at those positions whenever it is loaded. So a process that had built other
models first (a server hosting several, a tiered start's server, a test worker) could not load a trace saved where
they had not been built, and crashed building the guards where a position held another class's empty record. Around
a capture and a load vgc shows each such registry holding the traced model's own classes only, in the order its
modules are walked, and puts the rest back after: the layout a trace sees depends on the model alone.

Within that window (a capture at warm-up, or a load and its guard check) another thread running another
transformers model finds no record of its class: asked for hidden states or attentions, it would return none.
vgc compiles before serving, so only a process that warms one model while serving another meets it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch

# (module, attribute) of registries libraries read by key alone, keyed by `str(type(model))`; a module not yet
# imported has no model of its library built, and nothing to lay out.
KEYED_REGISTRIES = (("transformers.utils.output_capturing", "_CAN_RECORD_REGISTRY"),)


@contextlib.contextmanager
def laid_out_for(model: Any) -> Iterator[None]:
    """Within: each keyed registry holds only `model`'s classes' records, in walk order. After: every record
    back, in its old order, with any made meanwhile after them."""
    held = []
    for module_name, attribute in KEYED_REGISTRIES:
        registry = getattr(sys.modules.get(module_name), attribute, None)
        if not isinstance(registry, dict) or model is None:
            continue
        before = list(dict.items(registry))
        own = [key for key in _class_keys(model) if key in registry]
        # dict's own methods: the registry may be a dict subclass whose methods take a model, not a key
        records = [(key, dict.__getitem__(registry, key)) for key in own]
        dict.clear(registry)
        dict.update(registry, records)
        held.append((registry, before))
    try:
        yield
    finally:
        for registry, before in held:
            now = dict(dict.items(registry))
            dict.clear(registry)
            dict.update(registry, before)
            dict.update(registry, now)


def _class_keys(model: Any) -> list[str]:
    """`str(type(m))` of `model` and its submodules, preorder, each once."""
    return list(dict.fromkeys(str(type(module)) for module in submodules(model)))


def submodules(model: Any) -> Iterator[Any]:
    """`model` and the modules under it, preorder. The walk reads `_modules` itself and takes only modules from
    it: a model copy being unpickled may hold placeholders there (Dynamo's saved guard state leaves the submodules
    it does not guard so)."""
    stack = [model]
    while stack:
        module = stack.pop()
        yield module
        children = getattr(module, "__dict__", {}).get("_modules") or {}
        stack.extend(reversed([child for child in children.values() if isinstance(child, torch.nn.Module)]))
