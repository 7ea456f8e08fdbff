"""The input contract of a `vgc.compile` model: which dims are dynamic, and what every later call must satisfy.

Before the single trace, `mark_dynamic_dims` tells Dynamo which dims vary (per the dynamic-shapes mode). After
it, `InputContract` is built from the traced call and Dynamo's shape guards; its `check` runs on every call and
stands in for the guards vgc dropped (see `vgc/guards.py` for the individual checks).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from vgc import _compat
from vgc.config import DynamicShapesType
from vgc.guards import SizeGuard, TensorSpec, argument_tensors, build_size_guards, spec_of

logger = logging.getLogger("vgc")

DimSpec = int | list[int] | tuple[int, ...] | dict[int, str]
DynamicDims = dict[str, dict[int, str | None]]   # "name" or "name[i]" -> {dim: shape id or None}


def _normalize_dims(name: str, spec: DimSpec, ndim: int) -> dict[int, str | None]:
    """{dim: shape_id} with negative dims resolved against the tensor's rank."""
    if isinstance(spec, int):
        items = {spec: None}
    elif isinstance(spec, (list, tuple)):
        items = {d: None for d in spec}
    elif isinstance(spec, dict):
        items = dict(spec)
    else:
        raise ValueError(f"dynamic_arg_dims[{name!r}] must be an int, a list of ints or a dict dim -> shape id, "
                         f"got {spec!r}")
    out = {}
    for dim, shape_id in items.items():
        if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
            raise ValueError(f"dynamic_arg_dims[{name!r}]: dim {dim!r} is out of range for a {ndim}-d tensor")
        out[dim % ndim] = shape_id
    return out


def check_dynamic_arg_dims(signature: inspect.Signature, dynamic_arg_dims: dict[str, DimSpec] | None) -> None:
    unknown = sorted(set(dynamic_arg_dims or {}) - set(signature.parameters))
    if unknown:
        raise ValueError(f"dynamic_arg_dims names unknown argument(s) {unknown}; "
                         f"the model takes {list(signature.parameters)}")


def mark_dynamic_dims(arguments: dict[str, Any], dynamic_arg_dims: dict[str, DimSpec] | None,
                      mode: DynamicShapesType) -> DynamicDims:
    """Mark the dynamic dims of the call about to be traced; returns them per tensor.

    Default (no `dynamic_arg_dims`): dim 0 of every top-level tensor argument. Tensors inside a list argument
    stay static.
    """
    dynamic: DynamicDims = {}
    for name, value in arguments.items():
        for suffix, tensor in argument_tensors(value):
            if suffix:
                dims = {}
            elif dynamic_arg_dims is None:
                dims = {0: None} if tensor.dim() > 0 else {}
            else:
                spec = dynamic_arg_dims.get(name)
                dims = {} if spec is None else _normalize_dims(name, spec, tensor.dim())
            dynamic[name + suffix] = dims
            _mark(name + suffix, tensor, dims, mode)
    if not any(dynamic.values()):
        logger.warning("vgc: no dynamic dims were marked; the model is compiled for these exact shapes")
    return dynamic


def _mark(where: str, tensor: torch.Tensor, dims: dict[int, str | None], mode: DynamicShapesType) -> None:
    for dim, shape_id in dims.items():
        if mode == DynamicShapesType.UNBACKED:
            _compat.mark_unbacked(tensor, dim, shape_id)
            continue
        if mode == DynamicShapesType.BACKED and tensor.shape[dim] < 2:
            raise ValueError(
                f"{where}: dim {dim} has size {tensor.shape[dim]} at the first call; BACKED dynamic shapes "
                "specialise sizes 0 and 1, so the single trace must use a size >= 2. Call warmup(make_inputs) "
                "or first call with a larger input, or use DynamicShapesType.UNBACKED")
        _compat.mark_dynamic(tensor, dim)


def padded_dims(dynamic: DynamicDims) -> dict[str, int]:
    """The one dynamic dim of each top-level tensor argument, which CUDA graphs pad up to a capture size."""
    padded = {}
    for name, dims in dynamic.items():
        if not dims or "[" in name:
            continue
        if len(dims) > 1:
            raise ValueError(f"CUDA graphs pad one dynamic dim per input, but {name!r} has dims {sorted(dims)}; "
                             "mark one dim per input in dynamic_arg_dims, or use cudagraph_mode='none'")
        padded[name] = next(iter(dims))
    if not padded:
        raise ValueError("CUDA graphs need at least one dynamic input to pad (see dynamic_arg_dims), or "
                         "cudagraph_mode='none'")
    return padded


class InputContract:
    """What the traced graph assumes of its inputs, checked on every call instead of Dynamo's guards."""

    def __init__(self, traced_arguments: dict[str, Any], dynamic: DynamicDims, shape_guards: list):
        self.dynamic = dynamic
        self.specs = {name: spec_of(value, f"argument {name!r}",
                                    lambda t, name=name: TensorSpec.of(t, dynamic[name]))
                      for name, value in traced_arguments.items()}
        self.size_guards: list[SizeGuard] = build_size_guards(shape_guards)

    def check(self, arguments: dict[str, Any]) -> None:
        """Raise `InputMismatchError` naming the argument and the fix when a call breaks the contract."""
        for name, spec in self.specs.items():
            value = arguments[name]
            if not spec.ok(value):   # the message is built only for a call that fails
                spec.check(f"argument {name!r}", value)
        for guard in self.size_guards:
            guard.check(arguments)

    def report(self) -> dict[str, list[int]]:
        return {name: sorted(dims) for name, dims in self.dynamic.items() if dims}
