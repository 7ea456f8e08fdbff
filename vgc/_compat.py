"""Every use of a torch internal whose spelling differs between torch 2.11 and 2.14 lives here."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from typing import Any, Callable

import torch
import torch.fx as fx

logger = logging.getLogger("vgc")

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


@functools.cache
def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ---- splitting -------------------------------------------------------------------------------------------------

def split_module(gm: fx.GraphModule, partition: dict[fx.Node, int]) -> fx.GraphModule:
    from torch.fx.passes.split_module import split_module as _split

    kwargs = {"keep_original_order": True}
    # Uniform tuple outputs (torch >= 2.12) spare the runtime from unwrapping single outputs.
    if _accepts(_split, "tuple_return"):
        kwargs["tuple_return"] = True
    return _split(gm, None, lambda node: partition[node], **kwargs)


# ---- Inductor --------------------------------------------------------------------------------------------------

def standalone_compile(gm: fx.GraphModule, example_inputs: list, *, dynamic_shapes: str,
                       config_patches: dict[str, Any]):
    from torch._inductor import standalone_compile as _standalone_compile

    kwargs: dict[str, Any] = {"dynamic_shapes": dynamic_shapes, "options": {"config_patches": dict(config_patches)}}
    return _standalone_compile(gm, example_inputs, **kwargs)


def load_artifact(path: str, fmt: str):
    from torch._inductor import CompiledArtifact

    return CompiledArtifact.load(path=path, format=fmt)


def inductor_config_portable() -> dict[str, Any]:
    import torch._inductor.config as inductor_config

    return inductor_config.save_config_portable()


def functorch_config_portable() -> dict[str, Any]:
    import torch._functorch.config as functorch_config

    return functorch_config.save_config_portable()


def torch_build_key() -> str:
    from torch._inductor.codecache import torch_key

    return torch_key().hex()[:32]


def cpu_vec_isa() -> str:
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa())


# ---- Dynamo ----------------------------------------------------------------------------------------------------

def detect_fake_mode(inputs: list):
    return torch._guards.detect_fake_mode(inputs)


def traced_code_objects() -> list:
    """Code objects Dynamo inlined while tracing the current graph (read inside a backend)."""
    context = torch._guards.TracingContext.try_get()
    return list(getattr(context, "traced_code", None) or []) if context is not None else []


def shape_env_of(fake_mode):
    return getattr(fake_mode, "shape_env", None) if fake_mode is not None else None


def size_hint(value, fallback: int | None = None) -> int:
    """A concrete int for a SymInt (its hint), without adding a guard."""
    if isinstance(value, int):
        return value
    from torch.fx.experimental import symbolic_shapes

    if hasattr(symbolic_shapes, "optimization_hint"):
        return symbolic_shapes.optimization_hint(value, fallback=fallback)
    hint = value.node.hint
    if hint is None:
        if fallback is None:
            raise ValueError(f"symbolic size {value} has no hint")
        return fallback
    return int(hint)


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    torch._dynamo.mark_dynamic(tensor, dim)


def mark_unbacked(tensor: torch.Tensor, dim: int, shape_id: str | None = None) -> None:
    from torch._dynamo.decorators import mark_unbacked as _mark_unbacked

    kwargs = {}
    if shape_id is not None and _accepts(_mark_unbacked, "shape_id"):
        kwargs["shape_id"] = shape_id
    _mark_unbacked(tensor, dim, **kwargs)


def backed_size_oblivious(enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


def no_duck_shape():
    return torch.fx.experimental._config.patch(use_duck_shape=False)


def skip_all_guards(guard_entries) -> list[bool]:
    fn = getattr(torch.compiler, "skip_all_guards_unsafe", None)
    if fn is not None:
        return fn(guard_entries)
    return [False for _ in guard_entries]


def register_bytecode_hook(hook):
    return torch._dynamo.convert_frame.register_bytecode_hook(hook)


# ---- backend registration --------------------------------------------------------------------------------------

def _entry_point_provides(name: str) -> bool:
    from importlib.metadata import entry_points

    try:
        return name in entry_points(group="torch_dynamo_backends").names
    except Exception:  # broken metadata must not break `import vgc`
        return False


def register_backend_by_name(name: str, backend: Callable) -> None:
    """Make `torch.compile(backend=name)` work when vgc is importable but not installed.

    Where vgc is installed, torch finds it through the `torch_dynamo_backends` entry point and registers it
    itself; registering here too would make torch's lookup fail with "duplicate name".
    """
    from torch._dynamo.backends import registry

    if name in registry._COMPILER_FNS or _entry_point_provides(name):
        return
    registry.register_backend(compiler_fn=backend, name=name)


@functools.cache
def _passthrough_type(cls: type) -> type:
    from torch._dynamo.exc import ShortenTraceback

    def __init__(self, *args):
        ShortenTraceback.__init__(self, *args, first_useful_frame=None)

    return type(cls.__name__, (cls, ShortenTraceback), {"__init__": __init__, "__module__": cls.__module__})


def through_dynamo(exc: Exception) -> Exception:
    """An exception of the same type (a subclass) that Dynamo re-raises unwrapped from a backend.

    Dynamo wraps backend errors in BackendCompilerFailed; users should see vgc's own ValueError or
    CompileAfterWarmupError, which `except`/`pytest.raises` on that type then catch.
    """
    new = _passthrough_type(type(exc))(*exc.args)
    new.__cause__ = exc.__cause__
    return new


def source_name(source) -> str:
    """A Dynamo `Source`'s name, e.g. "L['input_ids'].size()[0]": a method in some torch versions, a property
    in others."""
    name = source.name
    return str(name() if callable(name) else name)


def copy_many(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """`target.copy_(source)` for every pair, in one multi-tensor kernel per dtype on CUDA."""
    torch._foreach_copy_(targets, sources)


def generated_forward(module: torch.fx.GraphModule) -> Callable:
    """The module's generated `forward`, bound. A lazily recompiled GraphModule's `forward` is a stub that
    regenerates the code and then goes through `Module.__call__` on every call: generate it now instead."""
    real_recompile = getattr(module, "real_recompile", None)   # torch.fx._lazy_graph_module._LazyGraphModule
    if real_recompile is not None:
        real_recompile()
    return module.forward


def direct_kernel(target) -> Callable | None:
    """The Python body of a `torch.library.custom_op`, when calling it directly equals dispatching to it.

    Dispatching a Python custom op costs tens of microseconds of host time (schema and mutation bookkeeping);
    the eager pieces between CUDA graphs pay it once per layer. Only ops with a single, device-generic kernel
    and no dispatch-level overrides qualify.
    """
    from torch._library import custom_ops

    if isinstance(target, torch._ops.OpOverloadPacket):
        target = getattr(target, "default", None)
    if not isinstance(target, torch._ops.OpOverload):
        return None
    opdef = custom_ops.OPDEFS.get(target._schema.name)
    if opdef is None or getattr(opdef, "_init_fn", None) is None:
        return None
    overrides = (getattr(opdef, "_torch_dispatch_fns", None), getattr(opdef, "_vmap_fn", None),
                 getattr(opdef, "_autocast_dtype", None), getattr(opdef, "_disabled_kernel", None))
    if set(getattr(opdef, "_backend_fns", {None: None})) != {None} or any(overrides):
        return None
    return opdef._init_fn
