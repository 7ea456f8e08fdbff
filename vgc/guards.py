"""Explicit checks that replace Dynamo's dropped guards.

`vgc.compile` drops every guard after its single trace, so a call that breaks an assumption of the traced graph
would otherwise run the wrong code silently. Instead, each call is checked cheaply: dtype, device and rank of
every tensor, static dims, which arguments are None, baked-in Python values, and the size relations Dynamo
guarded on (e.g. `input_ids` and `positions` have the same length, or a model's `if x.shape[0] > 4`).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch

from vgc import _compat

logger = logging.getLogger("vgc")

class InputMismatchError(TypeError):
    """A call's inputs differ from the traced ones in a way the compiled graph cannot serve."""


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


# A path into an argument: item steps (`[0]`, `['k']`) and attribute steps (`.field`, for dataclasses).
Step = tuple[str, Any]   # ("item", key) or ("attr", name)


def render_path(steps: tuple[Step, ...]) -> str:
    return "".join(f".{key}" if kind == "attr" else f"[{key!r}]" for kind, key in steps)


def follow(value: Any, steps: tuple[Step, ...]) -> Any:
    for kind, key in steps:
        value = getattr(value, key) if kind == "attr" else value[key]
    return value


def children(value: Any) -> list[tuple[Step, Any]] | None:
    """The parts of a container vgc checks per call (list, tuple, dict, dataclass); None for anything else."""
    if isinstance(value, (list, tuple)):
        return [(("item", i), v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return [(("item", k), v) for k, v in value.items()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(("attr", f.name), getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def argument_tensors(value: Any, steps: tuple[Step, ...] = ()) -> list[tuple[tuple[Step, ...], torch.Tensor]]:
    """Every tensor in an argument with its path: the tensor itself (path ()), or one inside its containers."""
    if isinstance(value, torch.Tensor):
        return [(steps, value)]
    parts = children(value)
    return [found for step, child in parts for found in argument_tensors(child, steps + (step,))] if parts else []


def describe(value: Any) -> str:
    """A value for an error message: shape and dtype for a tensor, never its contents."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__}"


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

    def __post_init__(self):
        object.__setattr__(self, "_keys", tuple(key for _, key in self.steps))   # read on every call

    def ok(self, value: Any) -> bool:
        if type(value) is not self.kind:
            return False
        if self.kind is dict:
            return tuple(value) == self._keys and all(spec.ok(value[k]) for k, spec in zip(self._keys, self.items))
        if isinstance(value, (list, tuple)):
            return len(value) == len(self.items) and all(spec.ok(v) for spec, v in zip(self.items, value))
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


SizeLocation = tuple[str, tuple[Step, ...], int]   # (argument, path inside it, dim)


@dataclass
class SizeGuard:
    """One relation between dynamic sizes that the traced graph relies on."""
    text: str                                  # e.g. "input_ids.size(0) == positions.size(0)"
    origin: str                                # the user code that made Dynamo guard, when known
    sizes: list[SizeLocation]                  # where each symbol's value is read, in order
    evaluate: Callable[..., bool]
    condition: bool = True   # a condition on a size (a branch, a bound), not an equality between sizes

    def check(self, arguments: dict[str, Any]) -> None:
        values = [follow(arguments[arg], steps).shape[dim] for arg, steps, dim in self.sizes]
        if not self.evaluate(*values):
            raise InputMismatchError(
                f"these inputs break an assumption of the traced graph: {self.text} "
                f"(sizes {', '.join(f'{size_name(s)}={v}' for s, v in zip(self.sizes, values))})"
                f"{'; it comes from: ' + self.origin if self.origin else ''}. The traced graph is only valid for "
                "such inputs; trace with inputs on the other side, "
                f"{'set compile_ranges_max_size so that warmup() traces each side of it, ' if self.condition else ''}"
                "or make the code size-independent")


def size_name(location: SizeLocation) -> str:
    arg, steps, dim = location
    return f"{arg}{render_path(steps)}.size({dim})"


_SOURCE_ARGUMENT = re.compile(r"L\['(\w+)'\]")
_SOURCE_STEP = re.compile(r"\[(\d+)\]|\['([^'\\]*)'\]|\.(\w+)(?![\w(])")
_SOURCE_SIZE = re.compile(r"\.size\(\)\[(\d+)\]")


def parse_size_source(source: str) -> SizeLocation | None:
    """Where a size symbol is read, from Dynamo's source name ("L['kv'][0].size()[2]", "L['meta'].lens.size()[0]");
    None for a source that is not a dim of an argument's tensor (a buffer of the model, a tensor's value)."""
    match = _SOURCE_ARGUMENT.match(source)
    if match is None:
        return None
    arg, position, steps = match[1], match.end(), []
    while (step := _SOURCE_STEP.match(source, position)) is not None:
        index, key, attribute = step.groups()
        steps.append(("item", int(index)) if index is not None else ("item", key) if key is not None
                     else ("attr", attribute))
        position = step.end()
    size = _SOURCE_SIZE.fullmatch(source, position)
    return None if size is None else (arg, tuple(steps), int(size[1]))


@dataclass(frozen=True)
class StateTensor:
    """A tensor of the model's own state (a weight or buffer) as the trace saw it; a saved trace holds only for a
    model whose tensor at `source` has this dtype, shape and device."""
    source: str                 # Dynamo's name for it, e.g. "L['self']._modules['lin']._parameters['weight']"
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str
    stride: tuple[int, ...] = ()   # Inductor's code indexes the weight with these strides


def resolve_source(source: str, roots: dict[str, Any]) -> Any:
    """The object Dynamo's source name `L['<root>']...` names, read from `roots`; raises LookupError when the path
    does not exist (or is not a chain of items and attributes)."""
    match = _SOURCE_ARGUMENT.match(source)
    if match is None or match[1] not in roots:
        raise LookupError(f"{source}: not rooted at one of {sorted(roots)}")
    value, position = roots[match[1]], match.end()
    while position < len(source):
        step = _SOURCE_STEP.match(source, position)
        if step is None:
            raise LookupError(f"{source}: cannot follow {source[position:]!r}")
        index, key, attribute = step.groups()
        try:
            value = value[int(index)] if index is not None else value[key] if key is not None else \
                getattr(value, attribute)
        except (KeyError, IndexError, AttributeError, TypeError) as e:
            raise LookupError(f"{source}: {type(e).__name__} at {step[0]!r}") from e
        position = step.end()
    return value


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
        for name, value in sorted(vars(module).items()):
            if callable(value) and not isinstance(value, (torch.nn.Module, torch.Tensor)):
                found.append((f"{path}.{name}", _callable_name(value)))
    return tuple(found)


def _callable_name(value: Any) -> str:
    code = getattr(value, "__code__", None)
    where = f"@{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{getattr(value, '__module__', None) or type(value).__module__}.{name}{where}"


def snapshot_shape_guards(fake_mode) -> list[tuple[sympy.Basic, str, dict[sympy.Symbol, str]]]:
    """Dynamo's shape guards so far (before Inductor adds its own), with each symbol's source name."""
    sources = _compat.symbol_sources(fake_mode)
    return [(expr, origin, {s: sources.get(s, "?") for s in expr.free_symbols})
            for expr, origin in _compat.shape_guards(fake_mode)]


def build_size_guards(snapshot, resolve: Callable[[SizeLocation], SizeLocation | None],
                      by_inductor: bool = False, conditions_level: int | None = logging.WARNING) -> list[SizeGuard]:
    """Per-call checks for the shape guards of a trace; `resolve` maps where Dynamo read a size to where it is in
    the call's bound arguments (None: not in them). `by_inductor` for the assumptions Inductor added;
    `conditions_level` logs each condition that is not an equality (None: not logged; compile ranges expect
    them, and log at INFO)."""
    guards, seen = [], set()
    for expr, origin, sources in snapshot:
        symbols = sorted(expr.free_symbols, key=str)
        if by_inductor and _is_size_one_specialisation(expr):
            continue   # sizes 0 and 1 run the general code by design (docs/dynamic-shapes.md)
        locations = {symbol: parse_size_source(sources.get(symbol, "")) for symbol in symbols}
        locations = {symbol: where and resolve(where) for symbol, where in locations.items()}
        # Symbols vgc cannot read from the arguments keep Dynamo's name for them (e.g. a buffer of the model).
        text = _render(expr, {symbol: size_name(where) if where else sources.get(symbol, str(symbol))
                              for symbol, where in locations.items()})
        if text in seen:   # the same assumption from another symbol of one size (or another op): one check
            continue
        seen.add(text)
        if not symbols or None in locations.values():
            logger.warning("the traced graph assumes %s (from %s), which vgc cannot check per call; calls that "
                           "break it will give wrong results", text, origin or "unknown code")
            continue
        guards.append(SizeGuard(text, origin, [locations[s] for s in symbols], _evaluator(expr, symbols),
                                not _is_equality(expr)))
        if conditions_level is None:
            continue
        if by_inductor:
            logger.info("Inductor compiled the symbolic-size code assuming %s; every call is checked against it",
                        text)
        elif not _is_equality(expr):
            logger.log(conditions_level, "the traced graph holds only when %s (from %s), e.g. a branch on a dynamic "
                       "size; calls that break it raise InputMismatchError", text, origin or "unknown code")
    return guards


def _is_size_one_specialisation(expr) -> bool:
    """`s >= 2`, `s > 1` or `s != 1` (`s != 0`): what a backed size assumes after a trace at a larger size. Which
    of them Inductor records depends on the path (keying an artifact for the cache adds `s != 1`)."""
    if isinstance(expr, sympy.Ne):
        return any(isinstance(a, sympy.Symbol) and b in (0, 1) for a, b in (expr.args, expr.args[::-1]))
    if isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan, sympy.LessThan, sympy.StrictLessThan)):
        lhs, rhs = (expr.lhs, expr.rhs) if isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan)) else \
            (expr.rhs, expr.lhs)
        bound = 2 if isinstance(expr, (sympy.GreaterThan, sympy.LessThan)) else 1
        return isinstance(lhs, sympy.Symbol) and rhs == bound
    return False


def _is_equality(expr) -> bool:
    """`s0 == s1`, or `4*s0 == 4*s1` (two sizes that broadcast together, seen through a reshape)."""
    if not isinstance(expr, sympy.Eq):
        return False
    (lc, lhs), (rc, rhs) = (side.as_coeff_Mul() for side in expr.args)
    return lc == rc and isinstance(lhs, sympy.Symbol) and isinstance(rhs, sympy.Symbol)


def _render(expr, names: dict) -> str:
    """`expr` as Python a user can read (`x.size(1) % 8 == 0`, `x.size(1) >= 7`), in the call's terms."""
    expr = expr.xreplace({s: sympy.Symbol(n) for s, n in names.items()})
    if isinstance(expr, sympy.core.relational.Relational) and expr.lhs.could_extract_minus_sign():
        expr = expr.reversedsign   # `-x <= -7` reads as `x >= 7`
    text = _compat.python_text(expr)
    if text is not None:
        return text
    text = str(expr)
    relation = re.fullmatch(r"(Eq|Ne)\((.*), (.*)\)", text)
    return f"{relation[2]} {'==' if relation[1] == 'Eq' else '!='} {relation[3]}" if relation else text


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
