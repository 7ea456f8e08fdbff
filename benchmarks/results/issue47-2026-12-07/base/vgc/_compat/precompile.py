"""Dynamo's AOT precompile: a saved trace's capture, bytes, load and guards.

Part of `vgc._compat`: every private torch API vgc uses (see its docstring)."""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from typing import Any, Callable

import torch


# ---- Dynamo AOT precompile (a saved trace) ------------------------------------------------------------------------

def _serializable_callable_base() -> type | None:
    try:
        from torch._dynamo.aot_compile_types import SerializableCallable
    except ImportError:
        return None
    return SerializableCallable


SerializableCallable: type = _serializable_callable_base() or object
"""The base class of a backend result that AOT precompile can save (`object` where torch has none)."""


def aot_precompile_available() -> bool:
    return _serializable_callable_base() is not None and hasattr(torch.compiler, "load_compiled_function")


def _aot_enabled():
    config = torch._dynamo.config
    return config.patch(enable_aot_compile=True) if hasattr(config, "enable_aot_compile") else contextlib.nullcontext()


def aot_capture(fn: Callable, backend: Callable, args: tuple, kwargs: dict, guard_filter: Callable):
    """Dynamo's whole-program capture of `fn(*args, **kwargs)` with `backend` (run once, inside), not run; the
    result is called with `fn`'s unbound arguments (`self` first for a bound method)."""
    with _aot_enabled():
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend,
                                 options={"guard_filter_fn": guard_filter})
        return compiled.aot_compile((args, kwargs))


def aot_program_bytes(program) -> bytes:
    """A captured program as bytes (what `save_compiled_function` writes, without the file)."""
    return type(program).serialize(program).serialized_data


def aot_program_load(data: bytes, f_globals: dict | None):
    """A program from `aot_program_bytes`; nothing is traced."""
    import io

    with _aot_enabled():
        return torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=f_globals)


def aot_guard_failure(program, args: tuple, kwargs: dict) -> str | None:
    """None when the program's saved guards hold for this call, else Dynamo's reason."""
    if program.guard_check(*args, **kwargs):
        return None
    try:
        return str(program._artifacts.guard_manager.check_verbose(program.prepare_f_locals(*args, **kwargs)))
    except Exception as e:  # the reason is for a log line only
        return f"(no reason: {type(e).__name__})"


def aot_import_module_aliases(program, f_globals: dict) -> list[str]:
    """Record, as imports a loading process makes itself, the modules the program's code reads through aliases
    Dynamo put into the traced function's globals by object id (`___module_collections_<id>_c0`): torch saves
    imports and picklable globals but not these, and a later process has no such name. Returns the aliases."""
    import builtins

    env = program._artifacts.runtime_env
    named = []
    for ref in sorted(env.external_refs):
        value = f_globals.get(ref)
        if ref in env.used_globals or ref in env.import_sources or hasattr(builtins, ref) or \
                not isinstance(value, types.ModuleType) or sys.modules.get(value.__name__) is not value:
            continue   # a module made at run time, not imported by name, would fail the loading process's import
        env.import_sources[ref] = value.__name__
        named.append(ref)
    return named


def aot_skip_guards(program) -> None:
    """Calls no longer evaluate the program's guards (vgc checks its inputs itself)."""
    program.disable_guard_check()


def aot_source_modules(program) -> list[str]:
    """Names of the modules whose code Dynamo traced for the program."""
    return sorted({source.module for source in program._artifacts.source_info.inlined_sources})


def aot_bytecode(program) -> tuple[Any, Any]:
    """(original code, transformed code) of a captured program, for `transformed_code.py`."""
    return program._artifacts.original_code, program._artifacts.runtime_env.bytecode


def aot_signature(program) -> inspect.Signature:
    """The signature a captured program is called with."""
    return program._artifacts.signature


def aot_backend_result(program):
    """What the backend returned for a captured or loaded program (vgc's `SavedGraph`)."""
    return program._artifacts.compiled_fn
