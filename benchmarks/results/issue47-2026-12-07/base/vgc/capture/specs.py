"""What each argument of the traced call looked like, checked on every later call: a tensor's dtype, device, rank,
static dims and contiguity, a baked-in Python value, a container's shape."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vgc.capture.paths import children, describe, follow, InputMismatchError, render_path, Step


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    device: torch.device
    ndim: int
    static_dims: tuple[tuple[int, int], ...]   # (dim, size) of every dim that is not dynamic
    contiguous: bool                             # compiled code indexes a contiguous input as such
    argument: str = field(default="", compare=False)     # where the tensor is, for the fix an error suggests
    steps: tuple = field(default=(), compare=False)
    _static_sizes: Callable = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # ok() runs for every tensor of every call: the static dims are read with one C-level getter.
        dims = tuple(d for d, _ in self.static_dims)
        sizes = tuple(s for _, s in self.static_dims)
        if not dims:
            getter = lambda shape: True  # noqa: E731
        elif len(dims) == 1:
            getter = lambda shape, d=dims[0], s=sizes[0]: shape[d] == s  # noqa: E731
        else:
            getter = lambda shape, get=operator.itemgetter(*dims): get(shape) == sizes  # noqa: E731
        object.__setattr__(self, "_static_sizes", getter)

    @classmethod
    def of(cls, tensor: torch.Tensor, dynamic_dims, argument: str = "", steps: tuple = ()) -> "TensorSpec":
        static = tuple((d, s) for d, s in enumerate(tensor.shape) if d not in dynamic_dims)
        return cls(tensor.dtype, tensor.device, tensor.dim(), static, tensor.is_contiguous(), argument, steps)

    def ok(self, t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and t.dtype == self.dtype and t.device == self.device
                and t.dim() == self.ndim and (not self.contiguous or t.is_contiguous())
                and self._static_sizes(t.shape))

    def check(self, where: str, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"{where}: expected a tensor as traced, got {describe(t)}")
        if t.dtype != self.dtype:
            raise InputMismatchError(f"{where}: dtype {t.dtype} differs from the traced {self.dtype}; "
                                     "cast the input or compile a second model for this dtype")
        if t.device != self.device:
            raise InputMismatchError(f"{where}: device {t.device} differs from the traced {self.device}")
        if t.dim() != self.ndim:
            raise InputMismatchError(f"{where}: rank {t.dim()} differs from the traced rank {self.ndim}")
        if self.contiguous and not t.is_contiguous():
            raise InputMismatchError(f"{where}: the tensor was contiguous when traced and is not now (strides "
                                     f"{t.stride()}); pass t.contiguous()")
        shape = t.shape
        for dim, size in self.static_dims:
            if shape[dim] != size:
                raise InputMismatchError(
                    f"{where}: size {shape[dim]} of dim {dim} differs from the traced {size}, and that dim is "
                    f"static; make it dynamic with {self._dynamic_dims_fix(dim)}")

    def _dynamic_dims_fix(self, dim: int) -> str:
        if not self.argument:
            return "dynamic_arg_dims"
        spec: Any = dim
        for kind, key in reversed(self.steps):   # {"kv": {0: 2}} for dim 2 of kv[0]; {"meta": {"lens": 0}}
            spec = {key: spec}
        return f"dynamic_arg_dims={{{self.argument!r}: {spec!r}}}" + \
            (f" (or {{{self.argument!r}: {dim}}} for dim {dim} of every tensor in it)" if self.steps else "")


_SCALARS = (type(None), bool, int, float, str, torch.dtype, torch.device)


@dataclass(frozen=True)
class ValueSpec:
    """A Python value Dynamo baked into the graph: later calls must pass an equal value of the same type."""
    value: Any

    def ok(self, value: Any) -> bool:
        return type(value) is type(self.value) and value == self.value

    def check(self, where: str, value: Any) -> None:
        if not self.ok(value):
            raise InputMismatchError(f"{where} is {describe(value)} but was {describe(self.value)} when traced; the "
                                     "traced value is baked into the compiled graph (compile another model for the "
                                     "other value)")


@dataclass(frozen=True)
class ContainerSpec:
    """A list, tuple, dict (a `**kwargs` too) or dataclass: same type, same length, keys or fields, and each part
    checked."""
    kind: type
    steps: tuple[Step, ...]
    items: tuple
    _keys: tuple = field(init=False, repr=False, compare=False)
    _oks: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_keys", tuple(key for _, key in self.steps))   # read on every call
        object.__setattr__(self, "_oks", tuple(spec.ok for spec in self.items))

    def ok(self, value: Any) -> bool:
        if type(value) is not self.kind:
            return False
        if self.kind is dict:
            return tuple(value) == self._keys and all(spec.ok(value[k]) for k, spec in zip(self._keys, self.items))
        if isinstance(value, (list, tuple)):   # a list (not a generator): fewer frames for 16 KV caches per call
            return len(value) == len(self._oks) and all([ok(v) for ok, v in zip(self._oks, value)])
        return all(spec.ok(getattr(value, k)) for k, spec in zip(self._keys, self.items))

    def check(self, where: str, value: Any) -> None:
        if type(value) is not self.kind:
            raise InputMismatchError(f"{where} must be a {self.kind.__name__} as traced, got {describe(value)}")
        steps = tuple(step for step, _ in children(value))
        if steps != self.steps:
            now, then = ([k for _, k in s] for s in (steps, self.steps))
            what = "keys" if isinstance(value, dict) else "length"
            raise InputMismatchError(f"{where}: {what} {now if what == 'keys' else len(now)} differs from the traced "
                                     f"{then if what == 'keys' else len(then)}; the structure of an argument is baked "
                                     "into the compiled graph")
        for step, spec in zip(self.steps, self.items):
            spec.check(where + render_path((step,)), follow(value, (step,)))


def spec_of(value: Any, where: str, tensor_spec: Callable[[tuple[Step, ...], torch.Tensor], TensorSpec],
            steps: tuple[Step, ...] = ()):
    """How to check `value` on later calls; `tensor_spec(path, tensor)` gives each tensor's check.

    An object vgc cannot look into is refused: Dynamo would bake whatever the trace read from it into the graph,
    and no per-call check could tell when a later call's object differs.
    """
    if isinstance(value, torch.Tensor):
        return tensor_spec(steps, value)
    if isinstance(value, _SCALARS):
        return ValueSpec(value)
    parts = children(value)
    if parts is None:
        raise ValueError(
            f"{where}{render_path(steps)} is a {type(value).__module__}.{type(value).__qualname__}, which "
            "vgc.compile cannot check on each call: the trace would bake in whatever it read from it, and a later "
            "call's object could differ silently. Pass its tensors and Python values as arguments (lists, tuples, "
            "dicts and dataclasses of them are checked per call), or use torch.compile(model, backend='vgc'), "
            "whose guards follow such objects (e.g. transformers' KV caches under generate()).")
    return ContainerSpec(type(value), tuple(step for step, _ in parts),
                         tuple(spec_of(child, where, tensor_spec, steps + (step,)) for step, child in parts))
