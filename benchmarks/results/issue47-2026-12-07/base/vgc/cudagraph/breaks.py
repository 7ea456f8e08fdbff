"""What ends a breakable capture: operators by name, torch functions, module classes and instances, and methods of
other classes (a cache's `update`). A break runs eagerly at every replay, between the captured segments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys

import torch

from vgc import _compat

DEFAULT_BREAKS = ("vgc::attention", "vgc::varlen_attention", "vgc::causal_attention",
                  "aten::scaled_dot_product_attention")


def function_names(func) -> tuple[str, ...]:
    """The operator names a torch-level callable answers to: its own for an operator, "aten::<name>" for a
    builtin of torch's C namespaces (F.scaled_dot_product_attention is torch._C._nn's)."""
    names = _compat.operator_names(func)
    if names:
        return names
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch._C") and hasattr(func, "__name__"):
        return (f"aten::{func.__name__}",)
    return ()


def _method_of(func) -> tuple[type, str] | None:
    """The class and attribute name of a function defined on a class (`DynamicCache.update` -> (Cache, "update"),
    found through its qualified name; a bound method counts as its function); None for a plain or nested function."""
    func = getattr(func, "__func__", func)
    qualname = getattr(func, "__qualname__", "")
    if not inspect.isfunction(func) or "<" in qualname or "." not in qualname:
        return None
    owner = sys.modules.get(func.__module__)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    return (owner, name) if isinstance(owner, type) and owner.__dict__.get(name) is func else None


@dataclasses.dataclass
class Breaks:
    """Where a capture is ended: operators by name, torch functions, module classes and module instances, and
    methods of other classes (a cache's `update`)."""
    op_names: frozenset[str]
    functions: tuple
    module_types: tuple[type, ...]
    modules: tuple[torch.nn.Module, ...]
    methods: tuple[tuple[type, str], ...] = ()

    @classmethod
    def of(cls, breaks) -> "Breaks":
        if breaks is None:
            breaks = DEFAULT_BREAKS
        if isinstance(breaks, (str, type, torch.nn.Module)) or not isinstance(breaks, (list, tuple, set)):
            raise ValueError(f"breaks must be a list (of operator names, torch functions, nn.Module classes or "
                             f"instances, methods), got {type(breaks).__name__} {breaks!r}")
        names, functions, types, modules, methods = set(), [], [], [], []
        for entry in breaks:
            if isinstance(entry, str):
                if "::" not in entry or entry.startswith("::") or entry.endswith("::"):
                    raise ValueError(f"breaks: operator names look like 'vgc::attention' or "
                                     f"'aten::scaled_dot_product_attention', got {entry!r}")
                names.add(entry)
            elif isinstance(entry, type) and issubclass(entry, torch.nn.Module):
                types.append(entry)
            elif isinstance(entry, torch.nn.Module):
                modules.append(entry)
            elif function_names(entry):
                functions.append(entry)
            elif (method := _method_of(entry)) is not None:
                methods.append(method)
            else:
                raise ValueError(f"breaks: {entry!r} is not an operator name, a torch function or operator, an "
                                 "nn.Module class or instance, or a method of a class. A plain Python function "
                                 "cannot be seen by the capture: put it in a module and list the module (it then "
                                 "runs eagerly at each replay)")
        return cls(frozenset(names), tuple(functions), tuple(types), tuple(modules), tuple(dict.fromkeys(methods)))

    _seen: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)   # func -> matches

    def matches(self, func) -> bool:
        try:
            return self._seen[func]
        except (KeyError, TypeError):   # TypeError: an unhashable callable, asked each time
            found = any(func is f for f in self.functions) or any(n in self.op_names for n in function_names(func))
            with contextlib.suppress(TypeError):
                self._seen[func] = found
            return found

    def modules_in(self, model) -> list[torch.nn.Module]:
        if not isinstance(model, torch.nn.Module):
            return list(self.modules)
        found = [m for m in model.modules() if isinstance(m, self.module_types) or any(m is b for b in self.modules)]
        return found + [m for m in self.modules if not any(m is f for f in found)]
