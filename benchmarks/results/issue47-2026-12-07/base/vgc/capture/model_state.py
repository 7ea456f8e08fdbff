"""The model's own state as a saved trace assumed it: its weights' dtypes, shapes, strides and devices, and the types
and functions its modules hold (what a trace bakes in that no per-call check sees)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vgc.capture.model_copy import PROCESS_LOCAL
from vgc.capture.paths import describe, resolve_source


@dataclass(frozen=True)
class StateTensor:
    """A tensor of the model's own state (a weight or buffer) as the trace saw it; a saved trace holds only for a
    model whose tensor at `source` has this dtype, shape and device."""
    source: str                 # Dynamo's name for it, e.g. "L['self']._modules['lin']._parameters['weight']"
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str
    stride: tuple[int, ...] = ()   # Inductor's code indexes the weight with these strides


def state_mismatch(expected: list[StateTensor], roots: dict[str, Any]) -> str | None:
    """What differs between the model's tensors and those a trace was made with (None: nothing)."""
    for spec in expected:
        try:
            value = resolve_source(spec.source, roots)
        except LookupError as e:
            return f"the model has no tensor at {e}"
        if not isinstance(value, torch.Tensor):
            return f"{spec.source} is {describe(value)}, not a tensor"
        if (value.dtype, tuple(value.shape), str(value.device)) != (spec.dtype, spec.shape, spec.device):
            return f"{spec.source} is {describe(value)}; the trace had {spec.dtype} {spec.shape} on {spec.device}"
        if spec.stride and tuple(value.stride()) != spec.stride:
            return f"{spec.source} has strides {tuple(value.stride())}; the trace had {spec.stride}"
    return None


def model_structure(model: Any) -> tuple[tuple[str, str], ...]:
    """(where, what) for the type of every submodule and every function or class a module holds as an attribute:
    what a trace bakes in that neither the tensor checks nor Dynamo's saved value guards see (its identity
    guards cannot be saved). A `nn.Tanh` swapped for a `nn.Sigmoid`, or `self.act = torch.neg`, changes it."""
    if not isinstance(model, torch.nn.Module):
        return ()
    found = []
    for path, module in model.named_modules():
        found.append((path or ".", _callable_name(type(module))))
        local = vars(module).get(PROCESS_LOCAL, ())   # this process's wrappers, which the trace does not read
        for name, value in sorted(vars(module).items()):
            if callable(value) and not isinstance(value, (torch.nn.Module, torch.Tensor)) and name not in local:
                found.append((f"{path}.{name}", _callable_name(value)))
    return tuple(found)


def state_shapes(model: Any) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """(name, dtype, shape) of every parameter and buffer: two models of one class whose weights differ in shape
    (another config) are other programs, and each needs its own saved trace."""
    if not isinstance(model, torch.nn.Module):
        return ()
    tensors = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    return tuple((name, str(t.dtype), tuple(t.shape)) for name, t in tensors)


def _callable_name(value: Any) -> str:
    code = getattr(value, "__code__", None)
    where = f"@{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{getattr(value, '__module__', None) or type(value).__module__}.{name}{where}"
