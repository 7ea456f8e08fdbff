"""One size of a breakable capture: the forward recorded as segment graphs and eager break calls, and its replay.

`capture_entry` runs the forward once under a stream capture that ends at every break (`vgc.cudagraph.breaks`),
noting where each tensor came from (a dynamic input, a leaf of another argument, an earlier break's result), and
refuses anything a replay could not repeat: a value read on the host inside a segment. `SegmentedReplay.replay`
runs the recorded steps on a call's inputs: each segment a `CapturedGraph`, each break an eager call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import logging
import os
import traceback
import warnings
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from vgc import _compat, cuda_runtime  # module attribute access: tests substitute begin_segment()/end_segment()
from vgc.capture.paths import describe
from vgc.cudagraph.breaks import Breaks, function_names
from vgc.cudagraph.captured import CapturedGraph

logger = logging.getLogger("vgc")

_VGC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
# Values compared per call, never handed over (a segment may have used them too): numbers, strings, dtypes...
_PRIMITIVES = (int, float, complex, bool, str, bytes, type(None), enum.Enum, torch.dtype, torch.device, torch.layout,
               torch.memory_format)


class BreakableCaptureError(RuntimeError):
    """A breakable capture met something a replay could not repeat (a host read inside a segment)."""


_CAPTURE_REFUSED = "operation not permitted when stream is capturing"


def _user_frame(error: BaseException | None = None) -> str:
    """Where in the user's code (not torch's, not vgc's, not a torch mode's handler) the current call, or the one
    that raised `error`, comes from."""
    stack = traceback.extract_tb(error.__traceback__) if error is not None else traceback.extract_stack()
    for frame in reversed(stack):
        path = os.path.abspath(frame.filename)
        if not path.startswith((_VGC_DIR, _TORCH_DIR)) and frame.name not in ("__torch_dispatch__",
                                                                              "__torch_function__"):
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "an unknown place"


@dataclasses.dataclass
class _Break:
    call: Callable
    name: str
    sources: list              # per leaf: ("input", name) | ("break", step, leaf) | ("const", value)
    outputs: list              # the result's leaves at capture
    copied: list[bool]         # per leaf: handed over as a copy (graph memory, to a module that may keep it)
    build: Callable            # leaves -> (args, kwargs)
    copy_back: set[int] = dataclasses.field(default_factory=set)   # result leaves a segment read


def _plan(value, count: list[int]):
    """The shape of plain tuples, lists and dicts around a call's leaves, each leaf by its index."""
    kind = type(value)
    if kind is tuple or kind is list:
        return kind, [_plan(item, count) for item in value]
    if kind is dict:
        return dict, [(key, _plan(item, count)) for key, item in value.items()]
    count[0] += 1
    return count[0] - 1


def _built(plan, leaves: list):
    if type(plan) is int:
        return leaves[plan]
    kind = plan[0]
    if kind is dict:
        return {key: _built(item, leaves) for key, item in plan[1]}
    items = [_built(item, leaves) for item in plan[1]]
    return items if kind is list else tuple(items)


def _builder(structure, leaves: list, spec) -> Callable[[list], Any]:
    """Rebuilds `structure` (a break's (args, kwargs)) from new leaves: by its plan, at a third of a pytree
    unflatten's cost (a replay does it per break, 32 times a step for a 16-layer decoder), where the plan puts
    each of `len(leaves)` distinct markers where pytree would (same spec, same order); else by pytree (a named
    tuple, a registered class, a None where pytree counts no leaf)."""
    plan = _plan(structure, [0])
    markers = [object() for _ in leaves]
    try:
        found, found_spec = _compat.tree_flatten(_built(plan, markers))
        plain = found_spec == spec and len(found) == len(markers) and all(a is b for a, b in zip(found, markers))
    except (IndexError, TypeError):
        plain = False
    if plain:
        return lambda new: _built(plan, new)
    return lambda new: _compat.tree_unflatten(new, spec)


def _result_leaves(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if type(result) is tuple and all(isinstance(x, torch.Tensor) for x in result):
        return list(result)
    return _compat.tree_leaves(result)


class _Capture:
    """The state of one size's capture: the steps recorded so far and where every tensor came from.

    Sources: ("input", name) for a dynamic input; ("arg", name, leaf) for a leaf (a tensor or an object) of another
    argument; ("break", step, leaf) for a break's result. An argument a break receives and no segment reads is
    handed over per call at replay (a cache object, a padding mask of any length); the rest are baked in and
    checked per call (`SegmentedReplay.mismatch`)."""

    def __init__(self, pool, breaks: Breaks | None, inputs: dict[str, torch.Tensor], others: dict[str, list]):
        self.pool = pool
        self.breaks = breaks              # None: a whole graph (no breaks)
        self.steps: list = []             # graphs and _Break, in replay order
        self.graph = None                 # the segment being recorded
        self.ops_in_segment = 0
        self.in_break = False
        self.source: dict[int, tuple] = {}   # id(tensor) -> ("input", name) | ("break", step, leaf)
        self.held: list = []                  # every tensor given a source stays alive, so its id stays unique
        self.viewed: dict[int, tuple] = {}    # id(view) -> the source it views: reading the view reads that source
        self.inputs_read: set[str] = set()   # dynamic inputs some segment reads (their extents are baked in)
        self.graph_storages: set[int] = set()   # storage addresses of tensors made inside segments
        self.watch_storage = False               # needed by module and method breaks only (their arguments' copies)
        self.args_read: set[tuple[str, int]] = set()       # argument leaves some segment reads
        self.args_to_breaks: set[tuple[str, int]] = set()  # argument leaves some break receives
        self.held_by: dict[int, str] = {}       # id(tensor) -> the argument object that holds it (a cache's keys)
        self.held_read: set[str] = set()        # argument objects a segment read a held tensor of
        for name, tensor in inputs.items():
            self._note(tensor, ("input", name))
        for name, values in others.items():   # each argument's leaves
            for i, leaf in enumerate(values):
                if not isinstance(leaf, _PRIMITIVES):
                    self._note(leaf, ("arg", name, i))
                if not isinstance(leaf, (torch.Tensor, torch.nn.Module, *_PRIMITIVES)):
                    for tensor in _tensors_held_by(leaf):
                        self.held_by[id(tensor)] = name
                        self.held.append(tensor)

    def _note(self, tensor: torch.Tensor, source: tuple) -> None:
        self.source[id(tensor)] = source
        self.held.append(tensor)

    def begin(self) -> None:
        self.graph = cuda_runtime.begin_segment(self.pool)
        self.ops_in_segment = 0

    def end(self) -> None:
        graph, self.graph = self.graph, None
        with warnings.catch_warnings():
            if not self.ops_in_segment:   # nothing torch launched (views only, or the end of the forward)
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            graph = cuda_runtime.end_segment(graph)
        # Kept even when no torch call was seen: code that launches kernels itself (a Triton kernel called from
        # Python) records into the segment all the same.
        graph.replay()   # capturing only records: the break after it (and the caller) need real values
        # a segment reads and writes the tensors the capture held (the entry's `pinned`, the static inputs)
        self.steps.append(CapturedGraph(graph, None))

    def abort(self) -> None:
        if self.graph is not None:
            graph, self.graph = self.graph, None
            with contextlib.suppress(Exception):
                cuda_runtime.end_segment(graph)

    # ---- seen from the modes ----
    def run_break(self, call: Callable, name: str, args: tuple, kwargs: dict, keeps_inputs: bool = False,
                  must_copy: bool = False):
        """End the segment, run `call` eagerly, record it as a replay step, resume capture. `keeps_inputs`: the
        call may hold on to its tensor arguments (a module's state): those in graph memory, which the next replay
        overwrites, are handed over as copies, now and at every replay. `must_copy`: the call is trusted to copy
        what it keeps (a cache's update), and refused if it keeps a graph-memory argument itself."""
        self.end()
        self.in_break = True   # what follows is the break's, not the segment's (a module break runs under the mode)
        leaves, spec = _compat.tree_flatten((args, kwargs))
        build = _builder((args, kwargs), leaves, spec)
        sources = [("const", leaf) if isinstance(leaf, _PRIMITIVES) else self.source.get(id(leaf), ("const", leaf))
                   for leaf in leaves]
        self.args_to_breaks.update(source[1:] for source in sources if source[0] == "arg")
        replaced = [(keeps_inputs or must_copy) and isinstance(leaf, torch.Tensor) and (
            "input" in (source[0], self.viewed.get(id(leaf), ("",))[0])
            or leaf.untyped_storage().data_ptr() in self.graph_storages) for leaf, source in zip(leaves, sources)]
        copied = replaced if keeps_inputs else [False] * len(leaves)
        if any(copied):
            args, kwargs = build([leaf.clone() if copy else leaf for leaf, copy in zip(leaves, copied)])
        watched = {leaf.untyped_storage().data_ptr() for leaf, watch in zip(leaves, replaced) if watch and must_copy}
        try:
            result = call(*args, **kwargs)
            outputs = _result_leaves(result)
            if watched and args and any(t.untyped_storage().data_ptr() in watched for t in _tensors_held_by(args[0])):
                raise BreakableCaptureError(
                    f"vgc breakable capture: {name} keeps a tensor argument that lives in graph memory (the next "
                    "replay overwrites it). A method break must copy what it keeps (as a cache's update does); or "
                    "list the nn.Module that calls it instead (module breaks are handed copies)")
            index = len(self.steps)
            # a replay calls a custom op's own function: the dispatcher's steps cost more than attention itself
            self.steps.append(_Break(_compat.custom_op_function(call) or call, name, sources, outputs, copied,
                                     build))
            for j, leaf in enumerate(outputs):
                if isinstance(leaf, torch.Tensor) and id(leaf) not in self.source:
                    self._note(leaf, ("break", index, j))
        finally:
            self.in_break = False
        self.begin()
        return result

    def refuse(self, what: str, where: str | None = None) -> None:
        raise BreakableCaptureError(
            f"vgc breakable capture: {what} inside a captured segment, at {where or _user_frame()}. A replay runs no "
            "Python of the forward, so the value read would be frozen at capture. Add the function or module that "
            "reads it to breaks= (an operator name, a torch function, or an nn.Module class or instance: it then "
            "runs eagerly at every replay), or take the read out of the forward")

    def saw(self, func, args: tuple, kwargs: dict):
        """A torch call inside a segment: refuse a host read, note what it reads, run it, note what it made."""
        what = _HOST_READS.get(func)
        if what is not None or (func in _MASK_INDEXING and _has_mask(args)):
            self.refuse(what or "indexing with a boolean mask makes a shape that depends on data (a host sync)")
        read = _tensors_in(args, kwargs)
        sources = [s for s in (self.source.get(id(x)) or self.viewed.get(id(x)) for x in read) if s is not None]
        out = func(*args, **kwargs)
        made = _tensors_in((out,), {})
        if not made:   # metadata (a shape, a dtype, a storage): no value is read (host reads are refused above)
            return out
        self.ops_in_segment += 1
        for source in sources:
            if source[0] == "input":
                self.inputs_read.add(source[1])
            elif source[0] == "arg":
                self.args_read.add(source[1:])
            else:
                self.steps[source[1]].copy_back.add(source[2])
        if self.held_by:
            self.held_read.update(self.held_by[id(x)] for x in read if id(x) in self.held_by)
        if isinstance(out, torch.Tensor):
            sourced = sources[-1] if sources else None
            if sourced is not None and out._is_view():
                # Reading the view reads its base; a break given the view gets the captured view (whose base is
                # baked in or refreshed by copy-back), not the base
                self.viewed[id(out)] = sourced
                self.held.append(out)
            if func in _TO_HOST and out.device.type == "cpu" and args[0].device.type != "cpu":
                self.refuse("a copy of a device tensor to the host (its values read later would be frozen)")
        if self.watch_storage:
            self.graph_storages.update(x.untyped_storage().data_ptr() for x in made)
        return out


def _tensors_held_by(obj, depth: int = 4) -> list[torch.Tensor]:
    """The tensors an argument object holds in its attributes, lists and dicts, a few levels down (a cache's
    layers' keys and values)."""
    found, todo, seen = [], [(obj, 0)], set()
    while todo:
        value, level = todo.pop()
        if isinstance(value, torch.Tensor):
            found.append(value)
            continue
        if level >= depth or id(value) in seen or isinstance(value, (torch.nn.Module, type, *_PRIMITIVES)):
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, (list, tuple, set)):
            children = value
        else:
            children = getattr(value, "__dict__", {}).values()
        todo.extend((child, level + 1) for child in children)
    return found


def _tensors_in(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among a call's arguments: tensors, and lists or tuples of them (an operator's `Tensor[]`, an
    index tuple), one level deep (a pytree walk per call made capture a third slower)."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(x for x in value if isinstance(x, torch.Tensor))
    return found


def _has_mask(args: tuple) -> bool:
    index = args[1] if len(args) > 1 else None
    return any(x.dtype in (torch.bool, torch.uint8) for x in _tensors_in((index,), {}))


_T = torch.Tensor
_HOST_READ = "reads a tensor's value on the host"
_DATA_SHAPE = "makes an output whose shape depends on data (a host sync)"
# What reads values on the host: caught where Python calls it, on every device. On a GPU the driver refuses any
# other sync inside a capture (an operator's own), which `capture_entry` reports the same way.
_HOST_READS = {
    _T.item: f".item() {_HOST_READ}", _T.tolist: f"Tensor.tolist() {_HOST_READ}",
    _T.numpy: f"Tensor.numpy() {_HOST_READ}", _T.__bool__: f"bool() of a tensor (an `if` on it) {_HOST_READ}",
    _T.__int__: f"int() of a tensor {_HOST_READ}", _T.__float__: f"float() of a tensor {_HOST_READ}",
    _T.__index__: f"using a tensor as an index {_HOST_READ}", _T.__repr__: f"printing a tensor {_HOST_READ}",
    _T.__format__: f"formatting a tensor {_HOST_READ}", torch.equal: f"torch.equal {_HOST_READ}",
    _T.equal: f"Tensor.equal {_HOST_READ}", torch.allclose: f"torch.allclose {_HOST_READ}",
    _T.allclose: f"Tensor.allclose {_HOST_READ}",
    **{f: f"{name} {_DATA_SHAPE}" for name, f in [
        ("nonzero", torch.nonzero), ("nonzero", _T.nonzero), ("argwhere", torch.argwhere),
        ("argwhere", _T.argwhere), ("masked_select", torch.masked_select), ("masked_select", _T.masked_select),
        ("unique", torch.unique), ("unique", _T.unique), ("unique_consecutive", torch.unique_consecutive),
        ("unique_consecutive", _T.unique_consecutive), ("bincount", torch.bincount), ("bincount", _T.bincount)]},
}
_MASK_INDEXING = {_T.__getitem__, _T.__setitem__}
_TO_HOST = {_T.to, _T.cpu}


class _BreakAtFunctions(TorchFunctionMode):
    """Ends the segment at each break, and watches every other torch call inside a segment (`_Capture.saw`)."""

    def __init__(self, capture: _Capture):
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        capture = self.capture
        if capture.in_break:
            return func(*args, **kwargs)
        if capture.breaks is not None and capture.breaks.matches(func):
            names = function_names(func)
            return capture.run_break(func, names[0] if names else repr(func), args, kwargs)
        return capture.saw(func, args, kwargs)


@contextlib.contextmanager
def _module_breaks(capture: _Capture, modules: list[torch.nn.Module]):
    """Each module's forward, for the capture's duration, ends the segment and runs eagerly (as a break)."""
    patched = []
    for module in modules:
        forward = module.forward

        def call(*args, _forward=forward, _name=type(module).__qualname__, **kwargs):
            if capture.in_break or capture.breaks is None:
                return _forward(*args, **kwargs)
            return capture.run_break(_forward, _name, args, kwargs, keeps_inputs=True)

        had = "forward" in module.__dict__
        module.forward = call
        patched.append((module, had, forward))
    try:
        yield
    finally:
        for module, had, forward in patched:
            if had:
                module.forward = forward
            else:
                del module.forward


@contextlib.contextmanager
def _method_breaks(capture: _Capture, methods: tuple[tuple[type, str], ...]):
    """Each method, on its class for the capture's duration, ends the segment and runs eagerly (as a break); its
    object is handed over per call when it is one of the call's arguments (a cache)."""
    patched = []
    for owner, name in methods:
        function = owner.__dict__[name]

        def call(*args, _function=function, _name=f"{owner.__qualname__}.{name}", **kwargs):
            if capture.in_break or capture.breaks is None:
                return _function(*args, **kwargs)
            return capture.run_break(_function, _name, args, kwargs, must_copy=True)

        setattr(owner, name, call)
        patched.append((owner, name, function))
    try:
        yield
    finally:
        for owner, name, function in patched:
            setattr(owner, name, function)


@dataclasses.dataclass
class SegmentedReplay:
    steps: list
    output_spec: Any
    output_sources: list          # per output leaf: a source (see _Capture) or ("static", value)
    input_shapes: dict[str, torch.Size]      # dynamic inputs a segment reads: their captured extents
    specs: dict[str, Any]                    # the structure of every other argument (its leaves are numbered)
    pinned: list[tuple[str, int, int]]       # (argument, leaf, address) of tensors baked in
    constants: list[tuple[str, int, Any]]    # (argument, leaf, value) of values and objects baked in
    segments: int
    breaks: int

    def leaves_of(self, arguments: dict, defaults: dict[str, tuple[list, Any]]) -> dict[str, tuple[list, Any]]:
        """Every argument's leaves and structure: flattened from the call, or `defaults`' (flattened once) for
        one the call left out."""
        return {name: _compat.tree_flatten(arguments[name]) if name in arguments else defaults[name]
                for name in self.specs}

    def mismatch(self, leaves: dict, padded: dict) -> str | None:
        """Why this call (its arguments' `leaves_of`) cannot replay the entry (a baked-in extent, address, value
        or structure differs), or None."""
        for name, shape in self.input_shapes.items():
            if padded[name].shape != shape:
                return f"{name} has shape {tuple(padded[name].shape)}, captured as {tuple(shape)}"
        for name, spec in self.specs.items():
            if leaves[name][1] != spec:
                return f"{name} is structured as {leaves[name][1]}, captured as {spec}"
        for name, leaf, address in self.pinned:
            if leaves[name][0][leaf].data_ptr() != address:
                return f"a tensor of {name} is not at the address it was captured with"
        for name, leaf, value in self.constants:
            now = leaves[name][0][leaf]
            if not (now == value if isinstance(value, _PRIMITIVES) else now is value):
                return f"{name} is {describe(now)}, captured as {describe(value)}"
        return None

    def replay(self, padded: dict, arguments: dict):
        fresh: dict[tuple[int, int], Any] = {}

        def resolve(source):
            kind = source[0]
            if kind == "input":
                return padded[source[1]]
            if kind == "break":
                return fresh[(source[1], source[2])]
            if kind == "arg":   # handed over per call (a break's cache object or mask)
                return arguments[source[1]][0][source[2]]
            return source[1]

        for index, step in enumerate(self.steps):
            if not isinstance(step, _Break):
                step.replay()
                continue
            args, kwargs = step.build([resolve(s).clone() if copy else resolve(s)
                                       for s, copy in zip(step.sources, step.copied)])
            leaves = _result_leaves(step.call(*args, **kwargs))
            if len(leaves) != len(step.outputs):
                raise RuntimeError(f"vgc breakable replay: {step.name} returned {len(leaves)} values, "
                                   f"{len(step.outputs)} at capture")
            for j, (old, new) in enumerate(zip(step.outputs, leaves)):
                fresh[(index, j)] = new
                if not isinstance(old, torch.Tensor):
                    if old != new:
                        raise RuntimeError(f"vgc breakable replay: {step.name} returned {new!r} where capture got "
                                           f"{old!r}, and the captured segments used that value; make the value "
                                           "a tensor, or move the code that uses it into the break")
                elif j in step.copy_back and old is not new:
                    if old.shape != new.shape:
                        raise RuntimeError(f"vgc breakable replay: {step.name} returned a tensor of shape "
                                           f"{tuple(new.shape)}, captured as {tuple(old.shape)}, and a captured "
                                           "segment reads it; add the code that reads it to breaks=")
                    old.copy_(new)
        return _compat.tree_unflatten([resolve(s) if s[0] != "static" else s[1] for s in self.output_sources],
                                      self.output_spec)

    def hands_over(self) -> list[str]:
        """The arguments handed to breaks per call, not baked in (for the log)."""
        baked = {(name, leaf) for name, leaf, _ in (*self.pinned, *self.constants)}
        return sorted({name for name, spec in self.specs.items() for leaf in range(spec.num_leaves)
                       if (name, leaf) not in baked})


def capture_entry(model: Callable, bound: inspect.BoundArguments, defaults: dict[str, tuple[list, Any]],
                  dynamic: dict[str, int], pool, breaks: Breaks | None,
                  module_breaks: list) -> tuple[SegmentedReplay, Any]:
    """Capture one call in segments; returns the entry and the call's output (real values). The entry holds every
    argument, `defaults` (flattened) for those the call left out: a call that passes one is then not taken for this
    one."""
    inputs = {name: bound.arguments[name] for name in dynamic}
    others = {**{name: leaves for name, leaves in defaults.items() if name not in dynamic},
              **{name: _compat.tree_flatten(value) for name, value in bound.arguments.items() if name not in dynamic}}
    capture = _Capture(pool, breaks, inputs, {name: values for name, (values, _) in others.items()})
    methods = breaks.methods if breaks is not None else ()
    capture.watch_storage = bool(module_breaks or methods) and breaks is not None
    with cuda_runtime.segment_stream(), _module_breaks(capture, module_breaks), _method_breaks(capture, methods), \
            _BreakAtFunctions(capture):
        capture.begin()
        try:
            out = model(*bound.args, **bound.kwargs)
        except BreakableCaptureError:
            capture.abort()   # here: the stand-in's recorder is a mode above the ones this block leaves
            raise
        except Exception as error:
            capture.abort()
            if _CAPTURE_REFUSED in str(error):   # the driver refused a sync the Python calls did not show
                capture.refuse("an operation that waits for the device (a host sync)", _user_frame(error))
            raise
        capture.end()
    leaves, spec = _compat.tree_flatten(out)
    output_sources = [("static", x) if isinstance(x, _PRIMITIVES) else capture.source.get(id(x), ("static", x))
                      for x in leaves]
    specs, pinned, constants = {name: spec for name, (_, spec) in others.items()}, [], []
    for name, (values, _) in others.items():
        for i, leaf in enumerate(values):
            if (name, i) in capture.args_to_breaks and (name, i) not in capture.args_read:
                if name in capture.held_read and not isinstance(leaf, torch.Tensor):
                    raise BreakableCaptureError(
                        f"vgc breakable capture: a captured segment reads a tensor that argument {name!r} "
                        f"({type(leaf).__name__}) holds, and a break receives that object and may replace it (a "
                        "cache's update). The segment would read the captured tensor at every replay. Add the code "
                        "that reads it to breaks=")
                continue   # handed over per call
            if isinstance(leaf, torch.Tensor):
                pinned.append((name, i, leaf.data_ptr()))
            else:
                constants.append((name, i, leaf))
    entry = SegmentedReplay(capture.steps, spec, output_sources,
                   {name: inputs[name].shape for name in capture.inputs_read}, specs, pinned, constants,
                   segments=sum(not isinstance(s, _Break) for s in capture.steps),
                   breaks=sum(isinstance(s, _Break) for s in capture.steps))
    return entry, out
