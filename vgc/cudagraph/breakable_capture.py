"""Breakable CUDA graphs: the model's own eager forward, captured per size without Dynamo or Inductor.

At each capture size the forward runs once under a stream capture that is ended at every *break* (by default
vgc's attention ops and SDPA): the break runs eagerly, and capture resumes in a new segment on the same memory
pool. A replay is the list it recorded: segment graphs and eager calls of the breaks, each on the tensors its
capture used (the static buffers), the call's own inputs substituted where the break read an input (so attention
meets this call's sequence lengths, whatever the batch's shape) and a break's fresh result where a later break
read the earlier one's (a KV-cache update feeding attention). Where a segment read a break's result, the result
is copied into the tensor the segment was captured with.

A replay runs no Python of the forward: a value the forward reads on the host inside a segment (`.item()`,
`.tolist()`, an op whose output shape depends on data, a copy between host and device) would be frozen at
capture. Capture refuses it, naming the call and the fix (mark the function or module that reads it as a break:
it then runs at every replay). Module breaks are how a forward's Python side effects (statistics, logging of
values) stay alive. Method breaks (a cache's `update`) get the call's own object when it is one of the call's
arguments: one capture serves a new cache per request, growing at every step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import logging
import os
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from vgc import _compat, cuda_runtime  # module attribute access: tests substitute begin_segment()/end_segment()
from vgc.capture.paths import describe
from vgc.config import CompilationConfig
from vgc.counters import Counters, counters
from vgc.cudagraph.memory import GraphMemory
from vgc.cudagraph.padding import output_tensors, padded_size, slice_outputs, StaticInputs
from vgc.cudagraph.runtime import frozen_gc
from vgc.ops.attention import lengths_read_once

logger = logging.getLogger("vgc")

DEFAULT_BREAKS = ("vgc::attention", "vgc::varlen_attention", "vgc::causal_attention",
                  "aten::scaled_dot_product_attention")

_VGC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
# Values compared per call, never handed over (a segment may have used them too): numbers, strings, dtypes...
_PRIMITIVES = (int, float, complex, bool, str, bytes, type(None), enum.Enum, torch.dtype, torch.device, torch.layout,
               torch.memory_format)


class BreakableCaptureError(RuntimeError):
    """A breakable capture met something a replay could not repeat (a host read inside a segment)."""


# ---- what breaks a capture --------------------------------------------------------------------------------------

def _function_names(func) -> tuple[str, ...]:
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
            elif _function_names(entry):
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
            found = any(func is f for f in self.functions) or any(n in self.op_names for n in _function_names(func))
            with contextlib.suppress(TypeError):
                self._seen[func] = found
            return found

    def modules_in(self, model) -> list[torch.nn.Module]:
        if not isinstance(model, torch.nn.Module):
            return list(self.modules)
        found = [m for m in model.modules() if isinstance(m, self.module_types) or any(m is b for b in self.modules)]
        return found + [m for m in self.modules if not any(m is f for f in found)]


# ---- one capture ------------------------------------------------------------------------------------------------

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
    checked per call (`_Entry.mismatch`)."""

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
        self.steps.append(graph)

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
# other sync inside a capture (an operator's own), which `_capture_entry` reports the same way.
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
            names = _function_names(func)
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


# ---- a captured size --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Entry:
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


def _capture_entry(model: Callable, bound: inspect.BoundArguments, defaults: dict[str, tuple[list, Any]],
                   dynamic: dict[str, int], pool, breaks: Breaks | None, module_breaks: list) -> tuple[_Entry, Any]:
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
    entry = _Entry(capture.steps, spec, output_sources,
                   {name: inputs[name].shape for name in capture.inputs_read}, specs, pinned, constants,
                   segments=sum(not isinstance(s, _Break) for s in capture.steps),
                   breaks=sum(isinstance(s, _Break) for s in capture.steps))
    return entry, out


# ---- the model ---------------------------------------------------------------------------------------------------

class BreakableGraphs:
    """What `vgc.cudagraph.breakable` returns: call it like the model, after `warmup()` captured its sizes.

    Outputs that a segment produced live in graph memory and are overwritten by the next call (as with
    `vgc.compile`'s graphs): use or clone them before calling again.
    """

    def __init__(self, model: Callable, *, dynamic_arg_dims: dict[str, int], capture_sizes: list[int] | None = None,
                 pad_values: dict[str, Any] | None = None, breaks=None,
                 uniform_decode: Callable[[dict], bool] | None = None):
        self.model = model
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        self._signature = inspect.signature(forward)
        defaults = {name: {} if p.kind is p.VAR_KEYWORD else () if p.kind is p.VAR_POSITIONAL else p.default
                    for name, p in self._signature.parameters.items()
                    if p.default is not p.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        self._default_leaves = {name: _compat.tree_flatten(value) for name, value in defaults.items()}
        if not isinstance(dynamic_arg_dims, dict) or not dynamic_arg_dims:
            raise ValueError("dynamic_arg_dims must name the tensor arguments whose size varies per call and the "
                             "dim that varies, e.g. {'input_ids': 0, 'positions': 0}; the first one is the call's size")
        for name, dim in dynamic_arg_dims.items():
            if name not in self._signature.parameters:
                raise ValueError(f"dynamic_arg_dims names {name!r}, which the forward does not take; its arguments "
                                 f"are {list(self._signature.parameters)}")
            if not isinstance(dim, int) or isinstance(dim, bool):
                raise ValueError(f"dynamic_arg_dims[{name!r}] must be a dim (an int), got {dim!r}")
        if pad_values is not None:
            unknown = sorted(set(pad_values) - set(dynamic_arg_dims))
            if unknown:
                raise ValueError(f"pad_values names {unknown}, which are not in dynamic_arg_dims "
                                 f"({list(dynamic_arg_dims)}); only dynamic inputs are padded")
        sizes = CompilationConfig(cudagraph_capture_sizes=capture_sizes).resolved_capture_sizes()
        self.dynamic = dict(dynamic_arg_dims)
        self.size_arg = next(iter(self.dynamic))
        self.capture_sizes = sizes
        self.may_pad = pad_values is not None
        self.static = StaticInputs(sizes[-1], pad_values)
        self.breaks = Breaks.of(breaks)
        self.uniform_decode = uniform_decode
        self.counters = Counters.child_of(counters)
        self.graphs: dict[int, _Entry] = {}        # size -> breakable graphs
        self.whole: dict[int, _Entry] = {}         # size -> one graph (uniform decode: attention inside)
        self.memory = GraphMemory()
        self._pool = None
        self._output_dims: list[tuple[int, ...]] | None = None
        self._eager_shapes: dict[int, list[torch.Size]] = {}
        self._warned: set[str] = set()
        self.seconds: dict[str, float] = {}

    # ---- warm-up: every capture before the first request ----
    def warmup(self, make_inputs: Callable[[int], Any],
               make_decode_inputs: Callable[[int], Any] | None = None) -> dict:
        """Capture every size, largest first (smaller ones reuse its pool blocks): `make_inputs(n)` makes a call
        of size n (kwargs as a dict, or positional args as a tuple). With `uniform_decode`, `make_decode_inputs(n)`
        makes a decode batch, captured whole (attention inside one graph) for the calls `uniform_decode` accepts."""
        if make_decode_inputs is not None and self.uniform_decode is None:
            raise ValueError("make_decode_inputs needs uniform_decode=<predicate on the call's arguments> at "
                             "construction, to tell the calls its whole graphs serve")
        start = time.perf_counter()
        module_breaks = self.breaks.modules_in(self.model)
        with torch.no_grad(), frozen_gc():
            for size in reversed(self.capture_sizes):
                self._capture_size(size, self._made(size, make_inputs), self.graphs, self.breaks, module_breaks)
            if make_decode_inputs is not None:
                for size in reversed(self.capture_sizes):
                    self._capture_size(size, self._made(size, make_decode_inputs), self.whole, None, [])
        self.seconds["capture"] = time.perf_counter() - start
        logger.info("breakable CUDA graphs: %d sizes (%d segments, %d breaks at the largest), %d whole graphs in "
                    "%.2f s; %s", len(self.graphs), *self._largest_counts(), len(self.whole),
                    self.seconds["capture"], self.memory.summary())
        return self.stats()

    def _largest_counts(self) -> tuple[int, int]:
        if not self.graphs:
            return 0, 0
        entry = self.graphs[max(self.graphs)]
        return entry.segments, entry.breaks

    def _bind(self, args, kwargs) -> inspect.BoundArguments:
        try:
            return self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"vgc breakable: the call does not fit the forward's signature {self._signature}: {e}") \
                from None

    def _made(self, size: int, make_inputs) -> inspect.BoundArguments:
        made = make_inputs(size)
        bound = self._bind(*((made, {}) if isinstance(made, tuple) else ((), made)))
        got = self.batch_size(bound.arguments)
        if got != size:
            raise ValueError(f"the inputs made for capture size {size} have size {got} ({self.size_arg} dim "
                             f"{self.dynamic[self.size_arg]}); make_inputs(n) must make calls of size n")
        return bound

    def capture(self, *args, **kwargs):
        """Capture this call's size from the call itself and return its output: for callers whose first call of
        each size is made before serving with the arguments real calls will have (a warm-up `generate()`, whose
        steps carry keyword arguments no example would think of). A size in `capture_sizes` only. The call runs
        once, captured (no warm-up run before it: the call may change state, as a cache's update does), so the
        model must have run eagerly on this device before (a prefill has)."""
        bound = self._bind(args, kwargs)
        size = self.batch_size(bound.arguments)
        if size not in self.capture_sizes:
            raise ValueError(f"capture(): a call of size {size}; the capture sizes are {self.capture_sizes}")
        start = time.perf_counter()
        with torch.no_grad(), frozen_gc():
            out = self._capture_size(size, bound, self.graphs, self.breaks, self.breaks.modules_in(self.model),
                                     warm=False)
        self.seconds["capture"] = self.seconds.get("capture", 0.0) + time.perf_counter() - start
        return out if out is not None else self._eager(self._bind(args, kwargs), None)

    def _capture_size(self, size: int, bound: inspect.BoundArguments, into: dict, breaks: Breaks | None,
                      module_breaks, warm: bool = True):
        """Capture the call `bound` (of `size`) into `into`; its output, or None when it could not be captured
        (logged; those calls run eagerly)."""
        for name, dim in self.dynamic.items():
            self.static.reserve(name, bound.arguments[name], dim, size)
        bound.arguments.update(self.static.pad_all(bound.arguments, self.dynamic, 0))
        call = lengths_read_once(self.model)
        if warm and (breaks is None or self._pool is None):
            # warm first: lazy initialisation, kernels compiled on first use, allocator blocks. Once done at the
            # first size, breakable captures need no more (their kernels at a new size are torch's own, and the
            # attention between segments runs outside any capture); whole graphs hold attention's kernels, which
            # compile per specialisation on first use, so each warms first.
            call(*bound.args, **bound.kwargs)
        device = bound.arguments[self.size_arg].device
        if self._pool is None:
            try:
                self._pool = cuda_runtime.new_pool()
            except RuntimeError as error:   # a CPU-only torch: no graphs at all
                self._warn_once(f"no CUDA graph pool ({str(error).splitlines()[0]}; the inputs are on {device}): "
                                "calls run eagerly")
                return None
        cuda_runtime.synchronize(device)
        before = cuda_runtime.reserved_bytes(device)
        cuda_runtime.reset_peak_memory(device)
        key = size if breaks is not None else f"whole:{size}"
        try:
            entry, out = _capture_entry(call, bound, self._default_leaves, self.dynamic, self._pool, breaks,
                                        module_breaks)
        except BreakableCaptureError:
            raise
        except torch.OutOfMemoryError as error:
            self.memory.out_of_memory(key, str(error).splitlines()[0])
            return None
        except Exception as error:   # noqa: BLE001 - a size that cannot be captured runs without graphs
            logger.warning("breakable capture at size %s failed (%s: %s); those calls run eagerly", key,
                           type(error).__name__, (str(error).strip().splitlines() or [""])[0])
            return None
        cuda_runtime.synchronize(device)
        self.memory.peak_bytes = max(self.memory.peak_bytes, cuda_runtime.peak_reserved_bytes(device))
        self.memory.captured(key, size, cuda_runtime.reserved_bytes(device) - before)
        into[size] = entry
        self.counters.add(cudagraph_captures=entry.segments)
        self._learn_output_dims(size, out)
        return out

    def _learn_output_dims(self, size: int, out) -> None:
        """Which output dims follow the call's size: those that differ between two sizes by their difference."""
        shapes = [t.shape for t in output_tensors(out)]
        for other, other_shapes in self._eager_shapes.items():
            if other != size and len(other_shapes) == len(shapes):
                self._output_dims = [tuple(d for d in range(len(a)) if len(a) == len(b) and a[d] - b[d] == size - other)
                                     for a, b in zip(shapes, other_shapes)]
                break
        self._eager_shapes[size] = shapes

    # ---- serving ----
    def batch_size(self, arguments: dict) -> int:
        return arguments[self.size_arg].shape[self.dynamic[self.size_arg]]

    def __call__(self, *args, **kwargs):
        bound = self._bind(args, kwargs)
        arguments = bound.arguments
        with torch.no_grad():
            size = self.batch_size(arguments)
            padded = padded_size(size, self.capture_sizes) if self.may_pad else size
            entry = None
            if padded is not None:
                if self.uniform_decode is not None and self.whole and self.uniform_decode(arguments):
                    entry = self.whole.get(padded)
                entry = entry or self.graphs.get(padded)
            if entry is None or not all(self.static.fits(name, arguments[name], dim, padded, size)
                                        for name, dim in self.dynamic.items()):
                return self._eager(bound, None)
            inputs = self.static.pad_all(arguments, self.dynamic, padded - size)
            leaves = entry.leaves_of(arguments, self._default_leaves)
            why = entry.mismatch(leaves, inputs)
            if why is not None:
                return self._eager(bound, why)
            out = _replay_once(entry, inputs, leaves)
            self.counters.add(cudagraph_replays=1)
        dims = iter(self._output_dims) if self._output_dims is not None else None
        return out if padded == size else slice_outputs(out, size, dims)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("breakable CUDA graphs: %s", message)

    def _eager(self, bound: inspect.BoundArguments, why: str | None):
        if why is not None:
            self._warn_once(f"a call runs eagerly: {why}")
        self.counters.add(eager_runs=1)
        return lengths_read_once(self.model)(*bound.args, **bound.kwargs)

    def stats(self) -> dict:
        return {
            "capture_sizes": sorted(self.graphs),
            "whole_graph_sizes": sorted(self.whole),
            "segments": {size: e.segments for size, e in sorted(self.graphs.items())},
            "breaks": {size: e.breaks for size, e in sorted(self.graphs.items())},
            "handed_over": self.graphs[max(self.graphs)].hands_over() if self.graphs else [],
            "seconds": dict(self.seconds),
            "graph_memory": self.memory.report(),
            "model_counters": self.counters.as_dict(),
        }


@lengths_read_once
def _replay_once(entry: _Entry, inputs: dict, leaves: dict):
    """A replay, its attention calls sharing one host read of the lengths (a prefill syncs once, not per layer)."""
    return entry.replay(inputs, leaves)


def breakable(model: Callable, *, dynamic_arg_dims: dict[str, int], capture_sizes: list[int] | None = None,
              pad_values: dict[str, Any] | None = None, breaks=None,
              uniform_decode: Callable[[dict], bool] | None = None) -> BreakableGraphs:
    """CUDA graphs of `model`'s eager forward with no Dynamo and no Inductor: per capture size, segments between
    the `breaks` (default `DEFAULT_BREAKS`: vgc's attention ops and SDPA), which run eagerly at each replay.

    `breaks`: operator names ("vgc::attention"), torch functions, nn.Module classes or instances, and methods of
    any class (`DynamicCache.update`: a method break must copy what it keeps). Other arguments that only breaks
    receive (a cache object, a mask of any length) are handed to them per call; the rest are baked in, and a call
    whose baked-in values differ runs eagerly.
    `dynamic_arg_dims`: each argument whose size varies per call and its dim (the first gives the call's size);
    `pad_values`: how to pad them up to a capture size (as for `vgc.compile`; without it only exact sizes replay);
    `uniform_decode`: a predicate on the call's arguments whose calls replay whole graphs (attention inside),
    captured from `warmup(..., make_decode_inputs=...)`. Call `warmup()` before serving.
    """
    return BreakableGraphs(model, dynamic_arg_dims=dynamic_arg_dims, capture_sizes=capture_sizes,
                           pad_values=pad_values, breaks=breaks, uniform_decode=uniform_decode)
