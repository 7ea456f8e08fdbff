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

This module owns the sizes, the warm-up and the per-call choice (replay, whole graph or eager);
`vgc.cudagraph.breaks` says what ends a capture, `vgc.cudagraph.segments` captures and replays one size.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import torch

from vgc import _compat, cuda_runtime
from vgc.config import CompilationConfig
from vgc.counters import Counters, counters
from vgc.cudagraph.breaks import Breaks, DEFAULT_BREAKS
from vgc.cudagraph.captured import CaptureLoop, largest_first
from vgc.cudagraph.memory import GraphMemory
from vgc.cudagraph.padding import batch_dims, output_tensors, padded_size, slice_outputs, StaticInputs
from vgc.cudagraph.runtime import capture_failure
from vgc.cudagraph.segments import BreakableCaptureError, capture_entry, SegmentedReplay
from vgc.ops.attention import lengths_read_once

__all__ = ["breakable", "BreakableCaptureError", "BreakableGraphs", "DEFAULT_BREAKS"]

logger = logging.getLogger("vgc")


class BreakableGraphs:
    """What `vgc.cudagraph.breakable` returns: call it like the model, after `warmup()` captured its sizes.

    Outputs that a segment produced live in graph memory and are overwritten by the next call (as with
    `vgc.compile`'s graphs): use or clone them before calling again.
    """

    def __init__(self, model: Callable, *, dynamic_arg_dims: dict[str, int], capture_sizes: list[int] | None = None,
                 pad_values: dict[str, Any] | None = None, breaks=None,
                 uniform_decode: Callable[[dict], bool] | None = None, capture_on_demand: bool = False):
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
        self.graphs: dict[int, SegmentedReplay] = {}        # size -> breakable graphs
        self.whole: dict[int, SegmentedReplay] = {}         # size -> one graph (uniform decode: attention inside)
        self.memory = GraphMemory()
        self._pool = None
        self._warmed = False   # a first capture ran the model before it
        # Without a warm-up (a model serving at once, as a tiered start's first tier): a call whose padded size has
        # no graph yet captures it, once the model has run a call eagerly (lazy initialisation done)
        self.capture_on_demand = capture_on_demand
        self._served = False
        self._not_capturable: set[int] = set()   # on demand: sizes whose capture failed, run eagerly
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
        module_breaks = self.breaks.modules_in(self.model)
        sizes = largest_first(self.capture_sizes)
        jobs = [(size, make_inputs, self.graphs, self.breaks, module_breaks) for size in sizes]
        if make_decode_inputs is not None:
            jobs += [(size, make_decode_inputs, self.whole, None, []) for size in sizes]
        with torch.no_grad():
            first = self._made(sizes[0], make_inputs)
            if not self._pool_ready(first):
                return self.stats()
            loop = self._loop(first)
            with loop.running(len(jobs)):
                for size, maker, into, breaks, modules in jobs:
                    bound = first if into is self.graphs and size == sizes[0] else self._made(size, maker)
                    self._capture_size(loop, size, bound, into, breaks, modules)
        self.seconds["capture"] = loop.seconds
        logger.info("breakable CUDA graphs: %d sizes (%d segments, %d breaks at the largest), %d whole graphs in "
                    "%.2f s; %s", len(self.graphs), *self._largest_counts(), len(self.whole),
                    self.seconds["capture"], self.memory.summary())
        return self.stats()

    def _loop(self, bound: inspect.BoundArguments) -> CaptureLoop:
        return CaptureLoop(self.memory, bound.arguments[self.size_arg].device, "breakable CUDA graphs")

    def _pool_ready(self, bound: inspect.BoundArguments) -> bool:
        """The graphs' memory pool exists; False (warned once: calls run eagerly) where torch has no CUDA."""
        device = bound.arguments[self.size_arg].device
        if not cuda_runtime.graphs_supported(device):
            # asked first: a CUDA build of torch on a machine without a driver hands out a pool, and the first
            # synchronize then raises
            self.capture_on_demand = False
            self._warn_once(f"the inputs are on {device}, where no CUDA graph runs: calls run eagerly")
            return False
        if self._pool is None:
            try:
                self._pool = cuda_runtime.new_pool()
            except RuntimeError as error:
                self.capture_on_demand = False
                self._warn_once(f"no CUDA graph pool ({str(error).splitlines()[0]}; the inputs are on "
                                f"{bound.arguments[self.size_arg].device}): calls run eagerly")
                return False
        return True

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
        if not self._pool_ready(bound):
            return self._eager(bound, None)
        loop = self._loop(bound)
        with torch.no_grad(), loop.running(collect=not self.capture_on_demand):
            out = self._capture_size(loop, size, bound, self.graphs, self.breaks, self.breaks.modules_in(self.model),
                                     warm=False)
        self.seconds["capture"] = self.seconds.get("capture", 0.0) + loop.seconds
        return out if out is not None else self._eager(self._bind(args, kwargs), None)

    def _capture_size(self, loop: CaptureLoop, size: int, bound: inspect.BoundArguments, into: dict,
                      breaks: Breaks | None, module_breaks, warm: bool = True):
        """Capture the call `bound` (of `size`) into `into`; its output, or None when it could not be captured
        (logged; those calls run eagerly)."""
        for name, dim in self.dynamic.items():
            self.static.reserve(name, bound.arguments[name], dim, size)
        bound.arguments.update(self.static.pad_all(bound.arguments, self.dynamic, 0))
        call = lengths_read_once(self.model)
        if warm and (breaks is None or not self._warmed):
            # warm first: lazy initialisation, kernels compiled on first use, allocator blocks. Once done at the
            # first size, breakable captures need no more (their kernels at a new size are torch's own, and the
            # attention between segments runs outside any capture); whole graphs hold attention's kernels, which
            # compile per specialisation on first use, so each warms first.
            call(*bound.args, **bound.kwargs)
            self._warmed = True
        key = size if breaks is not None else f"whole:{size}"

        def capture():
            try:
                return capture_entry(call, bound, self._default_leaves, self.dynamic, self._pool, breaks,
                                     module_breaks)
            except (BreakableCaptureError, torch.OutOfMemoryError):
                raise
            except Exception as error:   # noqa: BLE001 - a size that cannot be captured runs without graphs
                logger.warning("breakable capture at size %s failed (%s); those calls run eagerly", key,
                               capture_failure(error))
                return None

        captured = loop.capture(key, size, capture)
        if captured is None:
            return None
        entry, out = captured
        into[size] = entry
        self.counters.add(cudagraph_captures=entry.segments)
        self._learn_output_dims(size, out)
        return out

    def _learn_output_dims(self, size: int, out) -> None:
        """Which output dims follow the call's size (`padding.batch_dims`), once two sizes have been captured."""
        shapes = [t.shape for t in output_tensors(out)]
        for other, other_shapes in self._eager_shapes.items():
            if other != size:
                self._output_dims = batch_dims(shapes, size, other_shapes, other) or self._output_dims
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
            if entry is None and self.capture_on_demand and self._served and padded in self.capture_sizes \
                    and padded not in self._not_capturable:
                return self._capture_padded(bound, size, padded)
            if entry is None or not self.static.all_fit(arguments, self.dynamic, padded, size):
                return self._eager(bound, None)
            inputs = self.static.pad_all(arguments, self.dynamic, padded - size)
            leaves = entry.leaves_of(arguments, self._default_leaves)
            why = entry.mismatch(leaves, inputs)
            if why is not None:
                return self._eager(bound, why)
            out = _replay_once(entry, inputs, leaves)
            self.counters.add(cudagraph_replays=1)
        return self._unpadded(out, padded, size)

    def _unpadded(self, out, padded: int, size: int):
        """A padded call's outputs cut back to its own size (the learned output dims)."""
        if padded == size:
            return out
        return slice_outputs(out, size, iter(self._output_dims) if self._output_dims is not None else None)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("breakable CUDA graphs: %s", message)

    def _capture_padded(self, bound: inspect.BoundArguments, size: int, padded: int):
        """On demand: capture `padded` from this call (of `size`), padded into the static buffers; its output.
        Buffers are sized once, for the largest capture size: a graph reads them where they were, so a later call
        that needs more room than they have runs eagerly rather than move them."""
        arguments = bound.arguments
        for name, dim in self.dynamic.items():
            if name not in self.static.buffers:
                self.static.reserve(name, arguments[name], dim, size)
        if not self.static.all_fit(arguments, self.dynamic, padded, size):
            return self._eager(bound, None)
        call = inspect.BoundArguments(self._signature, {**arguments, **self.static.pad_all(arguments, self.dynamic,
                                                                                            padded - size)})
        try:
            out = self.capture(*call.args, **call.kwargs)
        except BreakableCaptureError as error:   # the forward reads values on the host: no graph can hold it
            self.capture_on_demand = False
            self._warn_once(f"no graphs for this model ({error}); calls run eagerly")
            return self._eager(bound, None)
        if padded not in self.graphs:
            self._not_capturable.add(padded)
        return self._unpadded(out, padded, size)

    def _eager(self, bound: inspect.BoundArguments, why: str | None):
        if why is not None:
            self._warn_once(f"a call runs eagerly: {why}")
        self._served = True
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
def _replay_once(entry: SegmentedReplay, inputs: dict, leaves: dict):
    """A replay, its attention calls sharing one host read of the lengths (a prefill syncs once, not per layer)."""
    return entry.replay(inputs, leaves)


def growing_dims(pairs: list[tuple[dict, dict]], size: int) -> dict[str, int] | None:
    """`dynamic_arg_dims` read from example calls: per pair of calls (their arguments by name) at `size` and at a
    larger size, the tensors that differ in exactly one dim, the first whose dim has extent `size` first (the
    call's size). Pairs of several kinds of call (prefill, decode) add up: a decode batch grows its per-sequence
    inputs too. None when a tensor differs in several dims, no tensor has extent `size` there, or two pairs
    disagree on an argument's dim."""
    found = []
    for a, b in pairs:
        dims = {}
        for name, x in a.items():
            y = b.get(name)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() == y.dim():
                changed = [d for d in range(x.dim()) if x.shape[d] != y.shape[d]]
                if len(changed) > 1:
                    return None
                if changed:
                    dims[name] = changed[0]
        first = next((name for name, d in dims.items() if a[name].shape[d] == size), None)
        if first is None:
            return None
        found.append({first: dims.pop(first), **dims})
    merged = dict(found[0]) if found else None
    for dims in found[1:]:
        if any(merged.get(name, d) != d for name, d in dims.items()):
            return None
        merged.update(dims)
    return merged


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
