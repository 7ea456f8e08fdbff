"""The input contract of a `vgc.compile` model: which dims are dynamic, and what every later call must satisfy.

Before the single trace, `dynamic_dims` reads which dims vary (by argument and path inside it), `argument_specs`
records what every later call must match (refusing objects it cannot check) and `mark_dynamic_dims` tells Dynamo.
After it, `InputContract` adds the size relations from Dynamo's shape guards; its `check` runs on every call and
stands in for the guards vgc dropped (the individual checks: `specs.py` and `size_guards.py` beside it).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from vgc import _compat
from vgc.capture.paths import argument_tensors, describe, follow, InputMismatchError, render_path, SizeLocation
from vgc.capture.size_guards import build_size_guards, SizeGuard
from vgc.capture.specs import ContainerSpec, spec_of, TensorSpec
from vgc.config import DynamicShapesType

logger = logging.getLogger("vgc")

DimSpec = int | list[int] | tuple[int, ...] | dict   # see `dynamic_dims`
DynamicDims = dict[str, dict[int, str | None]]   # "name" or "name<path>" -> {dim: shape id or None}


def _normalize_dims(where: str, spec: DimSpec, ndim: int) -> dict[int, str | None]:
    """{dim: shape_id} with negative dims resolved against the tensor's rank."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        items = {spec: None}
    elif isinstance(spec, (list, tuple)):
        items = {d: None for d in spec}
    elif _is_dim_dict(spec):
        items = dict(spec)
    else:
        raise ValueError(f"dynamic_arg_dims for {where} must be an int, a list of ints or a dict dim -> shape id "
                         f"for a tensor, got {spec!r}")
    out = {}
    for dim, shape_id in items.items():
        if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
            raise ValueError(f"dynamic_arg_dims for {where}: dim {dim!r} is out of range for a {ndim}-d tensor")
        out[dim % ndim] = shape_id
    return out


def _is_dim_dict(spec) -> bool:
    """{dim: shape id}, as opposed to a dict that addresses the parts of a container ({key or "*": spec})."""
    return isinstance(spec, dict) and all(isinstance(k, int) and not isinstance(k, bool) and
                                          (v is None or isinstance(v, str)) for k, v in spec.items())


def _spec_at(spec, steps: tuple) -> DimSpec | None:
    """The part of an argument's `dynamic_arg_dims` entry that applies at `steps` inside it.

    A dict that is not a dim dict addresses the container's parts by key, index or field name, "*" for any;
    anything else (an int, a list, a dim dict) given for a container applies to every tensor inside it.
    """
    for _, key in steps:
        if not isinstance(spec, dict) or _is_dim_dict(spec):
            break
        spec = spec.get(key, spec.get("*"))
    return spec


def check_dynamic_arg_dims(signature: inspect.Signature, dynamic_arg_dims: dict[str, DimSpec] | None) -> None:
    unknown = sorted(set(dynamic_arg_dims or {}) - set(signature.parameters))
    if unknown:
        raise ValueError(f"dynamic_arg_dims names unknown argument(s) {unknown}; "
                         f"the model takes {list(signature.parameters)}")


def dynamic_dims(arguments: dict[str, Any], dynamic_arg_dims: dict[str, DimSpec] | None) -> DynamicDims:
    """The dynamic dims of every tensor in the call about to be traced, by path.

    Default (no `dynamic_arg_dims`): dim 0 of every top-level tensor argument; tensors inside containers stay
    static. `{"kv": 2}` makes dim 2 of every tensor in `kv` dynamic; `{"kv": {0: 2}}` only `kv[0]`'s; `{"meta":
    {"lens": 0}}` a dataclass field's; `{"x": {0: "batch"}}` gives dim 0 of `x` a shape id shared with others.
    """
    dynamic: DynamicDims = {}
    for name, value in arguments.items():
        for steps, tensor in argument_tensors(value):
            where = name + render_path(steps)
            if dynamic_arg_dims is None:
                dims = {0: None} if not steps and tensor.dim() > 0 else {}
            else:
                spec = _spec_at(dynamic_arg_dims.get(name), steps)
                dims = {} if spec is None or (isinstance(spec, dict) and not _is_dim_dict(spec)) else \
                    _normalize_dims(f"{where!r}", spec, tensor.dim())
            dynamic[where] = dims
    for name in dynamic_arg_dims or {}:
        inside = [dims for where, dims in dynamic.items()
                  if where == name or where.startswith((name + "[", name + "."))]
        if not inside:   # e.g. an optional tensor passed as None in this call
            logger.warning("dynamic_arg_dims[%r]: argument %r holds no tensor in the traced call (%s)", name, name,
                           describe(arguments[name]))
        elif not any(inside):
            raise ValueError(f"dynamic_arg_dims[{name!r}] = {dynamic_arg_dims[name]!r} marks no dim of the tensors "
                             f"in argument {name!r} ({describe(arguments[name])}): its keys match none of the "
                             "argument's parts; see vgc.compile's docstring for the forms it takes")
    if not any(dynamic.values()):
        logger.warning("no dynamic dims were marked; the model is compiled for these exact shapes")
    return dynamic


def argument_specs(arguments: dict[str, Any], dynamic: DynamicDims) -> dict[str, Any]:
    """How every argument of the traced call is checked on later calls; refuses objects vgc cannot check."""
    return {name: spec_of(value, f"argument {name!r}",
                          lambda steps, t, name=name: TensorSpec.of(t, dynamic[name + render_path(steps)],
                                                                    name, steps))
            for name, value in arguments.items()}


def mark_dynamic_dims(arguments: dict[str, Any], dynamic: DynamicDims, mode: DynamicShapesType,
                      may_specialise: bool = False) -> None:
    """Tell Dynamo which dims of the call about to be traced vary, per the dynamic-shapes mode; `may_specialise`
    lets a backed size the trace needs one value of become a checked `size == n` (a compile range of one size)
    instead of an error."""
    for name, value in arguments.items():
        for steps, tensor in argument_tensors(value):
            where = name + render_path(steps)
            for dim, shape_id in dynamic[where].items():
                if mode == DynamicShapesType.UNBACKED:
                    _compat.mark_unbacked(tensor, dim, shape_id)
                    continue
                if mode == DynamicShapesType.BACKED and tensor.shape[dim] < 2:
                    raise ValueError(
                        f"{where}: dim {dim} has size {tensor.shape[dim]} at the first call; BACKED dynamic shapes "
                        "specialise sizes 0 and 1, so the single trace must use a size >= 2. Call "
                        "warmup(make_inputs) or first call with a larger input, or use DynamicShapesType.UNBACKED")
                (_compat.maybe_mark_dynamic if may_specialise else _compat.mark_dynamic)(tensor, dim)


def padded_dims(dynamic: DynamicDims, names) -> dict[str, int]:
    """The one dynamic dim of each top-level tensor argument (of `names`), which CUDA graphs pad up to a capture
    size."""
    padded = {}
    for name, dims in dynamic.items():
        if not dims or name not in names:   # nested tensors are not padded
            continue
        if len(dims) > 1:
            raise ValueError(f"CUDA graphs pad one dynamic dim per input, but {name!r} has dims {sorted(dims)}; "
                             "mark one dim per input in dynamic_arg_dims, or use cudagraph_mode='none'")
        padded[name] = next(iter(dims))
    if not padded:
        raise ValueError("CUDA graphs need at least one dynamic input to pad (see dynamic_arg_dims), or "
                         "cudagraph_mode='none'")
    return padded


def _resolve_location(signature: inspect.Signature, arguments: dict[str, Any],
                      location: SizeLocation) -> SizeLocation | None:
    """Where Dynamo read a size, as a place in the bound arguments; None when it is not in them.

    Dynamo names what the traced frame saw. When forward is wrapped by a decorator taking `*args, **kwargs`
    (transformers' models are), that frame's `kwargs['input_ids']` and `args[0]` are the bound arguments
    `input_ids` and the first parameter.
    """
    arg, steps, dim = location
    parameter = signature.parameters.get(arg)
    named = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                        p.KEYWORD_ONLY)]
    if (parameter is None or parameter.kind is parameter.VAR_KEYWORD) and steps and steps[0][1] in named:
        arg, steps = steps[0][1], steps[1:]
    elif parameter is None and steps and isinstance(steps[0][1], int) and steps[0][1] < len(named):
        arg, steps = named[steps[0][1]], steps[1:]
    try:   # only a place the traced call really had, holding a tensor with that dim
        follow(arguments[arg], steps).shape[dim]
    except (KeyError, IndexError, AttributeError, TypeError):
        return None
    return arg, steps, dim


class InputContract:
    """What the traced graph assumes of its inputs, checked on every call instead of Dynamo's guards."""

    def __init__(self, signature: inspect.Signature, traced_arguments: dict[str, Any], specs: dict[str, Any],
                 dynamic: DynamicDims, shape_guards: list, compiler_guards: list = (),
                 conditions_level: int | None = logging.WARNING):
        self.dynamic = dynamic
        self.specs = specs
        resolve = functools.partial(_resolve_location, signature, traced_arguments)
        self.size_guards: list[SizeGuard] = build_size_guards(shape_guards, resolve,
                                                              conditions_level=conditions_level) + \
            build_size_guards(compiler_guards, resolve, by_inductor=True, conditions_level=conditions_level)
        self._accepts_fast = _fast_check(specs, traced_arguments)

    def check(self, arguments: dict[str, Any]) -> None:
        """Raise `InputMismatchError` naming the argument and the fix when a call breaks the contract."""
        fast = self._accepts_fast
        if fast is None or not fast(arguments):
            for name, spec in self.specs.items():
                value = arguments[name]
                if not spec.ok(value):   # the message is built only for a call that fails
                    spec.check(f"argument {name!r}", value)
        for guard in self.size_guards:
            guard.check(arguments)

    def accepts(self, arguments: dict[str, Any]) -> bool:
        try:
            self.check(arguments)
        except InputMismatchError:
            return False
        return True

    def report(self) -> dict[str, list[int]]:
        return {name: sorted(dims) for name, dims in self.dynamic.items() if dims}


def _fast_check(specs: dict[str, Any], traced_arguments: dict[str, Any]):
    """`arguments -> bool`: True only for a call every spec accepts, with the tensors of the top-level arguments
    and of flat lists and tuples of tensors (a decoder's KV caches) checked in one C++ call of Dynamo's tensor
    check instead of one Python check each (about 24 against 6 µs for 18 tensors on a 2-core CPU, per call).
    False sends the call to the specs' own checks, which accept what this refuses and name what is wrong: it
    also holds a tensor to the traced one's dispatch keys, grad flag and strides. None where this torch has no
    such check."""
    gather: list[tuple[str, type | None, int]] = []   # (argument, container type or None for a tensor, length)
    others = []                                          # (argument, spec.ok) for the rest
    examples, sizes, strides, loose = [], [], [], []     # loose: tensors whose contiguity the strides leave open

    def add(spec: TensorSpec, example) -> None:
        static = dict(spec.static_dims)
        shape = [static.get(d) for d in range(spec.ndim)]
        expected: list[int | None] = [None] * spec.ndim
        if spec.contiguous:
            step = 1
            for d in reversed(range(spec.ndim)):   # a contiguous stride is known while the dims after it are static
                expected[d] = step
                step = None if step is None or shape[d] is None else step * shape[d]
            if None in expected:
                loose.append(len(examples))
        examples.append(example)
        sizes.append(shape)
        strides.append(expected)

    for name, spec in specs.items():
        value = traced_arguments[name]
        if isinstance(spec, TensorSpec):
            add(spec, value)
            gather.append((name, None, 1))
        elif isinstance(spec, ContainerSpec) and spec.kind in (list, tuple) and spec.items and \
                all(isinstance(item, TensorSpec) for item in spec.items):
            for item, example in zip(spec.items, value):
                add(item, example)
            gather.append((name, spec.kind, len(spec.items)))
        else:
            others.append((name, spec.ok))
    check = _compat.tensor_checker(examples, sizes, strides) if examples else None
    if check is None:
        return None

    def accepts(arguments: dict[str, Any]) -> bool:
        tensors = []
        for name, kind, length in gather:
            value = arguments[name]
            if kind is None:
                tensors.append(value)
            elif type(value) is kind and len(value) == length:
                tensors.extend(value)
            else:
                return False
        return check(*tensors) and all(tensors[i].is_contiguous() for i in loose) and \
            all(ok(arguments[name]) for name, ok in others)
    return accepts
