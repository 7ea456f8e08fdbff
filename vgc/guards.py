"""Explicit checks that replace Dynamo's dropped guards.

`vgc.compile` drops every guard after its single trace, so a call that breaks an assumption of the traced graph
would otherwise run the wrong code silently. Instead, each call is checked cheaply: dtype, device and rank of
every tensor, static dims, which arguments are None, baked-in Python values, and the size relations Dynamo
guarded on (e.g. `input_ids` and `positions` have the same length, or a model's `if x.shape[0] > 4`).
"""

from __future__ import annotations

import logging
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch

from vgc import _compat

logger = logging.getLogger("vgc")

_SIZE_SOURCE = re.compile(r"^L\['(?P<arg>\w+)'\](?:\[(?P<item>\d+)\])?\.size\(\)\[(?P<dim>\d+)\]$")


class InputMismatchError(TypeError):
    """A call's inputs differ from the traced ones in a way the compiled graph cannot serve."""


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    device: torch.device
    ndim: int
    static_dims: tuple[tuple[int, int], ...]   # (dim, size) of every dim that is not dynamic
    contiguous: bool                             # compiled code indexes a contiguous input as such
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
    def of(cls, tensor: torch.Tensor, dynamic_dims) -> "TensorSpec":
        static = tuple((d, s) for d, s in enumerate(tensor.shape) if d not in dynamic_dims)
        return cls(tensor.dtype, tensor.device, tensor.dim(), static, tensor.is_contiguous())

    def ok(self, t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and t.dtype == self.dtype and t.device == self.device
                and t.dim() == self.ndim and (not self.contiguous or t.is_contiguous())
                and self._static_sizes(t.shape))

    def check(self, where: str, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"{where}: expected a tensor as traced, got {type(t).__name__}")
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
                    f"static; add it to dynamic_arg_dims to make it dynamic")


def argument_tensors(value: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensors directly in an argument, with their suffix: the tensor itself (""), or a list's items ("[i]")."""
    if isinstance(value, torch.Tensor):
        return [("", value)]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return []


_SCALARS = (type(None), bool, int, float, str, torch.dtype, torch.device)


@dataclass(frozen=True)
class ValueSpec:
    """A Python value Dynamo baked into the graph: later calls must pass an equal value of the same type."""
    value: Any

    def ok(self, value: Any) -> bool:
        return type(value) is type(self.value) and value == self.value

    def check(self, where: str, value: Any) -> None:
        if not self.ok(value):
            raise InputMismatchError(f"{where} is {value!r} but was {self.value!r} when traced; the traced value "
                                     "is baked into the compiled graph (compile another model for the other value)")


@dataclass(frozen=True)
class ContainerSpec:
    """A list, tuple or dict (a `**kwargs` too): same type, same length or keys, and each item checked."""
    kind: type
    keys: tuple
    items: tuple

    def ok(self, value: Any) -> bool:
        if type(value) is not self.kind or len(value) != len(self.keys):
            return False
        if self.kind is dict:
            return tuple(value) == self.keys and all(spec.ok(value[k]) for k, spec in zip(self.keys, self.items))
        return all(spec.ok(item) for spec, item in zip(self.items, value))

    def check(self, where: str, value: Any) -> None:
        if type(value) is not self.kind:
            raise InputMismatchError(f"{where} must be a {self.kind.__name__} as traced, got {type(value).__name__}")
        keys = tuple(value) if isinstance(value, dict) else tuple(range(len(value)))
        if keys != self.keys:
            what = "keys" if isinstance(value, dict) else "length"
            raise InputMismatchError(f"{where}: {what} {list(keys) if what == 'keys' else len(keys)} differs from "
                                     f"the traced {list(self.keys) if what == 'keys' else len(self.keys)}; the "
                                     "structure of an argument is baked into the compiled graph")
        for key, spec in zip(self.keys, self.items):
            spec.check(f"{where}[{key!r}]", value[key])


@dataclass(frozen=True)
class OpaqueSpec:
    """An object vgc cannot compare per call (its attributes read while tracing are baked in)."""
    kind: type

    def ok(self, value: Any) -> bool:
        return isinstance(value, self.kind)

    def check(self, where: str, value: Any) -> None:
        if not self.ok(value):
            raise InputMismatchError(f"{where} must be a {self.kind.__name__} as traced, got {type(value).__name__}")


def spec_of(value: Any, where: str, top_level_tensor_spec: Callable[[torch.Tensor], TensorSpec] | None = None):
    """How to check `value` on later calls. Tensors nested in containers keep all their dims static."""
    if isinstance(value, torch.Tensor):
        return top_level_tensor_spec(value) if top_level_tensor_spec else TensorSpec.of(value, ())
    if isinstance(value, _SCALARS):
        return ValueSpec(value)
    if isinstance(value, (list, tuple, dict)):
        keys = tuple(value) if isinstance(value, dict) else tuple(range(len(value)))
        return ContainerSpec(type(value), keys, tuple(spec_of(value[k], f"{where}[{k!r}]") for k in keys))
    logger.warning("vgc: %s (a %s) is not checked per call; whatever the trace read from it is baked into the "
                   "compiled graph", where, type(value).__name__)
    return OpaqueSpec(type(value))


@dataclass
class SizeGuard:
    """One relation between dynamic sizes that the traced graph relies on."""
    text: str                                  # e.g. "input_ids.size(0) == positions.size(0)"
    origin: str                                # the user code that made Dynamo guard, when known
    sizes: list[tuple[str, int | None, int]]   # (argument, list item or None, dim) per symbol, in order
    evaluate: Callable[..., bool]

    def check(self, arguments: dict[str, Any]) -> None:
        values = []
        for arg, item, dim in self.sizes:
            value = arguments[arg]
            values.append((value if item is None else value[item]).shape[dim])
        if not self.evaluate(*values):
            raise InputMismatchError(
                f"these inputs break an assumption of the traced graph: {self.text} "
                f"(sizes {', '.join(f'{self._name(s)}={v}' for s, v in zip(self.sizes, values))})"
                f"{'; it comes from: ' + self.origin if self.origin else ''}. The traced graph is only valid for "
                "such inputs; trace with inputs on the other side, or make the code size-independent")

    @staticmethod
    def _name(size) -> str:
        arg, item, dim = size
        return f"{arg}{'' if item is None else f'[{item}]'}.size({dim})"


def snapshot_shape_guards(fake_mode) -> list[tuple[sympy.Basic, str, dict[sympy.Symbol, str]]]:
    """Dynamo's shape guards so far (before Inductor adds its own), with each symbol's source name."""
    sources = _compat.symbol_sources(fake_mode)
    return [(expr, origin, {s: sources.get(s, "?") for s in expr.free_symbols})
            for expr, origin in _compat.shape_guards(fake_mode)]


def build_size_guards(snapshot) -> list[SizeGuard]:
    guards = []
    for expr, origin, sources in snapshot:
        symbols = sorted(expr.free_symbols, key=str)
        locations, names = [], {}
        for symbol in symbols:
            match = _SIZE_SOURCE.match(sources.get(symbol, ""))
            if match is None:
                locations = None
                break
            item = match["item"]
            locations.append((match["arg"], None if item is None else int(item), int(match["dim"])))
            names[symbol] = SizeGuard._name(locations[-1])
        if not locations:
            logger.warning("vgc: the traced graph assumes %s (from %s), which vgc cannot check per call; "
                           "calls that break it will give wrong results", expr, origin or "unknown code")
            continue
        text = _render(expr, names)
        guards.append(SizeGuard(text, origin, locations, _evaluator(expr, symbols)))
        if not _is_equality(expr):
            logger.warning("vgc: the traced graph holds only when %s (from %s), e.g. a branch on a dynamic "
                           "size; calls that break it raise InputMismatchError", text, origin or "unknown code")
    return guards


def _is_equality(expr) -> bool:
    return isinstance(expr, sympy.Eq) and all(isinstance(a, sympy.Symbol) for a in expr.args)


def _render(expr, names: dict) -> str:
    text = str(expr.xreplace({s: sympy.Symbol(n) for s, n in names.items()}))
    eq = re.fullmatch(r"Eq\((.*), (.*)\)", text)
    return f"{eq[1]} == {eq[2]}" if eq else text


def _evaluator(expr, symbols) -> Callable[..., bool]:
    try:
        fn = sympy.lambdify(symbols, expr, modules="math")
    except Exception:
        fn = None

    def slow(*values):
        return bool(expr.xreplace(dict(zip(symbols, map(sympy.Integer, values)))))

    if fn is None:
        return slow

    def fast(*values):
        try:
            return bool(fn(*values))
        except Exception:  # torch's sympy functions (FloorDiv, Mod variants) that lambdify cannot print
            return slow(*values)
    return fast
