"""Dynamo: dynamic dims, guards, compile ids, errors, recompile limits, tracing context.

Part of `vgc._compat`: every private torch API vgc uses (see its docstring)."""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, Callable

import torch

from vgc._compat.graphs import _accepts


# ---- Dynamo: dynamic dims, guards, compile ids, errors, recompile limits, tracing context -------------------------

def device_from_inputs(example_inputs) -> torch.device:
    """The device of a graph's first input that has one, else CPU (a graph of only Python numbers): Dynamo's rule
    for backends (`torch._dynamo.backends.common.device_from_inputs`), written out rather than imported from a
    private module that pulls in AOTAutograd."""
    return next((x.device for x in example_inputs if hasattr(x, "device")), torch.device("cpu"))


def traced_code_objects() -> list:
    """Code objects Dynamo inlined while tracing the current graph (read inside a backend)."""
    context = torch._guards.TracingContext.try_get()
    return list(getattr(context, "traced_code", None) or []) if context is not None else []


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Make Dynamo trace `dim` of `tensor` as a backed symbolic size; documented, but under `torch._dynamo`."""
    torch._dynamo.mark_dynamic(tensor, dim)


def maybe_mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Like `mark_dynamic`, but a trace that needs one value of the size specialises it (a guard `size == n`)
    instead of failing."""
    torch._dynamo.maybe_mark_dynamic(tensor, dim)


def mark_unbacked(tensor: torch.Tensor, dim: int, shape_id: str | None = None) -> None:
    """Make Dynamo trace `dim` of `tensor` as an unbacked size; dims with one `shape_id` share a symbol where
    torch accepts `shape_id` (newer versions only)."""
    from torch._dynamo.decorators import mark_unbacked as _mark_unbacked

    kwargs = {}
    if shape_id is not None and _accepts(_mark_unbacked, "shape_id"):
        kwargs["shape_id"] = shape_id
    _mark_unbacked(tensor, dim, **kwargs)


def assume_equal(a, b) -> None:
    """Tell the tracer two sizes are equal (a replacement for backed sizes, a runtime check for unbacked ones)."""
    torch._check(a == b)


def backed_size_oblivious(enabled: bool):
    """A context in which backed sizes are traced size-obliviously (no 0/1 specialisation); private config."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


def no_duck_shape():
    """A context in which equal sizes get distinct symbols unless the code relates them; private config."""
    return torch.fx.experimental._config.patch(use_duck_shape=False)


def skip_all_guards(guard_entries) -> list[bool]:
    """A `guard_filter_fn` that drops every guard Dynamo can drop: public, but only in newer torch versions;
    older ones keep every guard."""
    fn = getattr(torch.compiler, "skip_all_guards_unsafe", None)
    if fn is not None:
        return fn(guard_entries)
    return [False for _ in guard_entries]


def register_bytecode_hook(hook):
    """Call `hook(code, new_code)` with Dynamo's transformed bytecode of every frame it compiles; returns a
    removable handle. Private `convert_frame`."""
    return torch._dynamo.convert_frame.register_bytecode_hook(hook)


def dynamo_compile_id() -> str | None:
    """The id of the Dynamo compile in progress ("frame/recompile", e.g. "0/1"), or None outside one; the id
    torch's own logs use. Read from the private `torch._guards.CompileContext`."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    return None if compile_id is None else str(compile_id)


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


def untraceable_errors() -> tuple[type[Exception], ...]:
    """What Dynamo raises for code it cannot trace, and the symbolic-shapes error for a guard on a data-dependent
    size (private modules; stable names since torch 2.1)."""
    from torch._dynamo.exc import Unsupported
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return Unsupported, GuardOnDataDependentSymNode


def forget_size_history() -> None:
    """Forget which sizes Dynamo has seen change, per code object (its automatic-dynamic state, private
    `torch._dynamo.pgo`), without dropping compiled code: a benchmark that compiles one model class under several
    strategies in one process would otherwise trace each strategy with the dims an earlier one saw vary."""
    try:
        from torch._dynamo import pgo
    except ImportError:   # a torch without it keeps this state per compiled function
        return
    reset = getattr(pgo, "reset_code_state", None)
    if reset is not None:
        reset()


def allow_recompiles(limit: int) -> None:
    """Let Dynamo keep at least `limit` compiled versions of one frame (private `torch._dynamo.config`): a
    benchmark compiles one model's forward under several strategies."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def tracing_context():
    """The TracingContext a backend runs in, to compile inside it later (`within_tracing_context`)."""
    return torch._guards.TracingContext.try_get()


def within_tracing_context(context):
    return torch._guards.tracing(context) if context is not None else contextlib.nullcontext()


_GUARD_ROOT = re.compile(r"[A-Za-z_]\w*")
# A function's default values are its code's constants: the entry's source hash pins them. Guards that reach them
# through closures may also name objects a library builds lazily (transformers 5.25 with `kernels` installed wraps
# functions per module at first call), so a fresh process cannot even evaluate them before its first call.
_FUNCTION_DEFAULTS = re.compile(r"\.__(kw)?defaults__\b")


def model_state_guard_filter(argument_names: set[str], take_over: Callable[[Any], bool] | None = None) -> Callable:
    """A `guard_filter_fn` for a saved program: keep the serializable guards on the model's own state (its
    attributes' values, hooks, global torch state) and on globals the trace read (a module constant), and drop
    those on the call's arguments (vgc's input contract checks them) and on sizes. Types and the functions a
    model holds are checked by vgc itself (`guards.ModelStructure`), and so is any guard `take_over(entry)` says
    vgc records and checks itself (an entry has `name`, `guard_type`, `has_value`, `value`, `is_global`)."""
    from torch._dynamo.guards import CheckFunctionManager

    # Identity guards name objects of this process (a module, a function, a local class): they cannot be saved.
    # Type and attribute-lookup guards are left out too: the source hash of the entry already pins the classes'
    # code, and rebuilding a hundred type guards costs a warm start about a second. Weights' dtypes and shapes are
    # checked by vgc (`guards.state_mismatch`), in a millisecond instead of Dynamo's tensor guards' 0.4 s.
    unsupported = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ())) | {
        "SHAPE_ENV", "TYPE_MATCH", "NOT_PRESENT_IN_GENERIC_DICT", "DICT_NOT_CONTAINS", "TENSOR_MATCH"}

    def keep(entries) -> list[bool]:
        kept = []
        for entry in entries:
            root = _GUARD_ROOT.match(entry.name)
            types = {entry.guard_type, *getattr(entry, "derived_guard_types", ())}
            kept.append(not types & unsupported and not getattr(entry.orig_guard, "_unserializable", False)
                        and not _FUNCTION_DEFAULTS.search(entry.name)
                        and (entry.is_global or root is None or root[0] not in argument_names)
                        and not (take_over is not None and take_over(entry)))
        return kept
    return keep


def has_module_hooks(model) -> bool:
    """Forward hooks on `model` or any of its submodules, or global ones: a saved trace must not serve such a
    model (a hook added after the save would be skipped; one on the top module is outside `forward`)."""
    modules = torch.nn.modules.module
    if not isinstance(model, torch.nn.Module):
        return False
    return bool(modules._global_forward_hooks or modules._global_forward_pre_hooks) or any(
        m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def tensor_checker(tensors: list, sizes: list[list], strides: list[list]) -> Callable[..., bool] | None:
    """Dynamo's own C++ check of many tensors at once (`TensorGuards`): each later tensor has the example's dtype,
    device, dispatch keys and grad flag, and the given sizes and strides (None: any). `check(*tensors)` -> bool.
    None where this torch has no such check."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return None
