"""`vgc.compile`: trace once with Dynamo (or load the trace an earlier process saved), drop its guards, compile
everything at warm-up, never compile again.

`CompiledModel` orchestrates; the jobs are done by objects built when their inputs exist: the `TraceSession`
(the first call: a saved trace, else a captured and saved one), the `TraceOnceBackend` (split, compile, cache),
the `InputContract` (built from the trace; checks every call) and, on CUDA, the `GraphDispatcher` (built from the
trace; pads, captures, replays).
"""

from __future__ import annotations

import inspect
import logging
import time
import weakref
from typing import Any, Callable

import torch

from vgc import _compat, cuda_runtime
from vgc.background_compile import BackgroundCompile, HeadStart, read_payload, write_result
from vgc.cache.entry import records_root
from vgc.capture import compile_ranges
from vgc.capture.contract import (argument_specs, check_dynamic_arg_dims, DimSpec, dynamic_dims, InputContract,
                                  mark_dynamic_dims, padded_dims)
from vgc.capture.model_copy import ModelCopyError
from vgc.capture.paths import argument_tensors, InputMismatchError
from vgc.config import CompilationConfig, CUDAGraphMode
from vgc.counters import counters
from vgc.cudagraph import traffic
from vgc.cudagraph.breakable_capture import BreakableGraphs, growing_dims
from vgc.cudagraph.dispatch import GraphDispatcher
from vgc.distributed import rank_and_size, RankFailedError, StartCheckIn
from vgc.trace_once import TraceOnceBackend, TraceSession

logger = logging.getLogger("vgc")


class _NotSaved(LookupError):
    """A start that may only load (a tiered one) found no saved trace it can use."""


class _KeptState:
    """The tensors of the call that finds the background compile done (its KV caches, whatever it hands the model),
    as they were before the swap: warm-up's calls run again at the swap, between two requests, and write where
    their inputs say (a cache `make_inputs` refills, the slots its batch names), which is live state by then.
    `restore()` writes the copies back in place, so graphs captured on those tensors keep their addresses."""

    def __init__(self, args: tuple, kwargs: dict):
        self.copies = {}
        for value in (*args, *kwargs.values()):
            for _, tensor in argument_tensors(value):
                storage = tensor.untyped_storage()
                self.copies.setdefault((storage.data_ptr(), storage.device), (storage, storage.clone()))

    def restore(self) -> None:
        with torch.no_grad():
            for storage, copy in self.copies.values():
                storage.copy_(copy)
        self.copies.clear()


class CompiledModel:
    """What `vgc.compile` returns: call it like the model; `warmup()` first to compile everything up front."""

    def __init__(self, model: Callable, config: CompilationConfig | dict | None = None,
                 dynamic_arg_dims: dict[str, DimSpec] | None = None, pad_values: dict[str, Any] | None = None,
                 uniform_decode: Callable[[dict], bool] | None = None, record: str | None = None,
                 tiered: bool = False):
        self.model = model
        self.config = _as_config(config)
        if tiered and self.config.compile_ranges_max_size:
            raise ValueError("tiered=True does not take compile_ranges_max_size yet: a tiered start compiles one "
                             "trace in the background; leave one of the two out")
        if tiered and rank_and_size()[1] > 1:
            raise ValueError("tiered=True serves one process: with several ranks each would compile alone, outside "
                             "their start check-in; start the ranks without it")
        self.tiered = tiered
        self.tier: str | None = None   # tiered: "eager" while the model itself serves, "compiled" after the swap
        self._tier_calls = {"eager": 0, "graphs": 0, "compiled": 0}
        self._first_graphs: BreakableGraphs | None = None   # tiered, on CUDA: the first tier's graphs
        self._background: BackgroundCompile | None = None
        self._background_phases: dict[str, float] = {}   # tiered: the child's, once it has ended
        self._head_start: HeadStart | None = None   # tiered: what the first call waits on, begun at warm-up
        self.background_compile: str | None = None   # tiered: "running", "done" or "failed"
        self.background_failure: str | None = None   # tiered: why it failed, as warned
        self._pending_warmup: tuple | None = None   # the warmup() a swap runs, from the cache
        self._load_only = False   # a start that must load its trace (a tiered one), never trace it
        # a profile is checked now: a bad file fails vgc.compile(), not the start it would shape
        self.profile = traffic.load_profile(self.config.cudagraph_traffic_profile, "decoder") \
            if self.config.cudagraph_traffic_profile else None
        self.recorder = traffic.TrafficRecorder(record, "decoder") if record is not None else None
        self._size_of: tuple[str, int] | None = None   # (argument, dim) whose extent a recorded call's size is
        self._warming = False   # warm-up's own calls are not traffic
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        self._signature = inspect.signature(forward)
        # The parameters, in order, when each can be passed by keyword (no *args, **kwargs or positional-only).
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._keyword_names = dict.fromkeys(self._signature.parameters) if all(
            p.kind in keyword for p in self._signature.parameters.values()) else None
        check_dynamic_arg_dims(self._signature, dynamic_arg_dims)
        self.dynamic_arg_dims = dynamic_arg_dims
        self.pad_values = None if pad_values is None else dict(pad_values)
        self.uniform_decode = uniform_decode
        mode = self.config.cudagraph_mode
        if mode is not None and mode.has_full and mode.has_piecewise and uniform_decode is None:
            raise ValueError(f"cudagraph_mode {mode.name} needs uniform_decode=<predicate on the call's "
                             "arguments> to tell decode batches (FULL graph) from the rest (PIECEWISE)")
        self.backend = TraceOnceBackend(self.config)
        self._forward = forward
        self._run: Callable | None = None   # calls the traced program with the call's arguments
        self.contract: InputContract | None = None   # built by the trace
        self.graphs: GraphDispatcher | None = None    # built by the trace, on CUDA with a graph mode
        self._seconds: dict[str, float] = {}
        self.trace_source: str | None = None   # "saved" (loaded, no Dynamo), "traced" (and saved) or "traced-live"
        self.warmed_up = False
        self.ranges: list[compile_ranges.CompileRange] = []   # by size, when warm-up traced compile ranges
        self._other_ranges: list[CompiledModel] = []           # the ranges' models other than this one
        self._uncovered: list[tuple[int, int]] = []
        self._range_at: int | None = None   # the size a compile range past the first was traced at (its identity)

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        if self.tier == "eager":
            return self._first_tier(args, kwargs)
        if self.contract is None:
            return self._start(args, kwargs)
        if self.tiered and not self._warming:
            self._tier_calls["compiled"] += 1
        arguments = self._bind(args, kwargs)
        try:
            self.contract.check(arguments)
        except InputMismatchError as e:
            if not self._other_ranges:
                raise
            out = self._routed(arguments, args, kwargs, e)
        else:
            out = self._serve(arguments, args, kwargs)
        if self.recorder is not None and not self._warming and self._size_of is not None:
            self._record(arguments)   # a call that was served: it passed the checks, so its size dim exists
        return out

    # ---- a tiered start ----
    def _first_tier(self, args, kwargs):
        """A call while the compile runs in the background: the model itself answers, until the compile's trace
        and artifacts are in the cache; then the call that finds them swaps them in and is the first served
        compiled."""
        if self._background is not None and self._background.done():
            self._swap(args, kwargs)
        if self._head_start is not None:
            self._head_start.wait()
            self._head_start = None
        if self.tier == "eager":
            graphs = self._first_graphs
            with torch.no_grad():
                if graphs is None:
                    self._tier_calls["eager"] += 1
                    return self.model(*args, **kwargs)
                eager = graphs.counters.eager_runs
                out = graphs(*args, **kwargs)   # a replay, or a capture (whose first replay answers)
            self._tier_calls["eager" if graphs.counters.eager_runs > eager else "graphs"] += 1
            return out
        return self(*args, **kwargs)

    def _swap(self, args: tuple, kwargs: dict) -> None:
        background, self._background = self._background, None
        self._seconds["background_compile"] = background.seconds
        self._background_phases = background.phases()
        self.background_compile = "failed"
        if background.result() is None:
            self.background_failure = background.failure()
            logger.warning("tiered start: the background compile failed (%s); the model itself keeps serving",
                           self.background_failure)
            background.cleanup()
            return
        start = time.perf_counter()
        self.tier, self._load_only, self._warming = None, True, True
        kept = None
        try:
            kept = _KeptState(args, kwargs)   # a copy of the live state: memory for it can run out too
            self._warmup(*self._pending_warmup)
        except Exception as e:   # the cache could not serve it after all: this process never compiles
            self.contract = self.graphs = self._run = None
            self.backend.graphs.clear()
            self.tier = "eager"
            self.background_failure = f"its trace could not be loaded here ({type(e).__name__}: {e})"
            logger.warning("tiered start: the background compile succeeded, but %s; the model itself keeps serving",
                           self.background_failure)
        else:
            self.tier, self.background_compile = "compiled", "done"
            self._first_graphs = None   # their memory goes back to the allocator
            self._seconds["swap"] = time.perf_counter() - start
            logger.info("tiered start: swapped in the compiled model after %d calls served by the model itself "
                        "(background compile %.1f s, load %.2f s)", self._tier_calls["eager"], background.seconds,
                        self._seconds["swap"])
        finally:
            if kept is not None:
                kept.restore()
            self._load_only = self._warming = False
            background.cleanup()

    def wait_for_compile(self, timeout: float | None = None) -> bool:
        """A tiered start: wait (at most `timeout` seconds) for the background compile to end; the next call swaps
        it in. True when it has ended (or none runs)."""
        return self._background is None or self._background.wait(timeout)

    def _start_tiered(self, make_inputs, trace_size, make_decode_inputs) -> dict[str, Any]:
        """Warm-up of a tiered start: from the cache when it holds this model's trace (as any warm start), else
        the model itself serves while a child process traces and compiles the first call's program into the
        cache, and a later call swaps it in."""
        self._pending_warmup = (make_inputs, trace_size, make_decode_inputs)
        self._load_only = True
        try:
            self._warmup(make_inputs, trace_size, make_decode_inputs)
        except _NotSaved:
            self.backend.graphs.clear()
        else:
            self.tier = "compiled"
            return self.stats()
        finally:
            self._load_only = False
        args, kwargs = _as_call(make_inputs(self._trace_size(trace_size)))
        options = {"config": self.config, "dynamic_arg_dims": self.dynamic_arg_dims, "pad_values": self.pad_values,
                   "uniform_decode": self.uniform_decode}
        try:
            self._background = BackgroundCompile("vgc.api:compile_in_background", self.model, args, kwargs,
                                                 options)
        except ModelCopyError as e:   # nothing lost: this process compiles, as a start that is not tiered
            logger.warning("tiered start: the model cannot be compiled in another process (%s); compiling here", e)
            self._warmup(make_inputs, trace_size, make_decode_inputs)
            self.tier = "compiled"
            return self.stats()
        weakref.finalize(self, self._background.cleanup)   # a server that exits stops its compile
        self.tier, self.background_compile = "eager", "running"
        self._head_start = HeadStart(records_root(self.config), _device_of((*args, *kwargs.values())).type)
        try:
            self._first_graphs = self._first_tier_graphs(self._trace_size(trace_size), make_inputs,
                                                         make_decode_inputs)
        except Exception as e:   # noqa: BLE001 - graphs are the first tier's speed, never its correctness
            logger.warning("tiered start: the first tier runs without graphs (%s: %s)", type(e).__name__, e)
        return self.stats()

    def _first_tier_graphs(self, size: int, *makers) -> BreakableGraphs | None:
        """The first tier on breakable CUDA graphs of the model's own forward (no compiler: its own kernels, each
        attention op between two segments), where `vgc.compile` captures graphs: on CUDA with a graph mode. A
        padded size captures on its first call after the model's first (`capture_on_demand`). The dynamic dims
        are `dynamic_arg_dims` (one dim each), else those in which `make_inputs` (and `make_decode_inputs`)
        differ between two sizes (the one of extent `size` first). None: the model serves by itself."""
        made = [[self._bind(*_as_call(make(n))) for n in (size, size + 1)] for make in makers if make is not None]
        device = _compat.device_from_inputs([v for v in made[0][0].values() if isinstance(v, torch.Tensor)])
        if self._graph_mode(device) == CUDAGraphMode.NONE or not cuda_runtime.graphs_supported(device):
            return None
        if self.dynamic_arg_dims is not None:
            dims = {name: d for name, d in self.dynamic_arg_dims.items() if isinstance(d, int)}
            dims = dims if len(dims) == len(self.dynamic_arg_dims) else None
        else:
            dims = growing_dims(made, size)
        if not dims:
            logger.info("tiered start: the first tier runs without graphs (no argument of make_inputs grows in one "
                        "dim with the size)")
            return None
        # Arguments that do not grow with the size (per-sequence ones, in a prefill) are not padded: a graph holds
        # them where they are, or hands them to its breaks (attention) per call.
        pad_values = None if self.pad_values is None else {k: v for k, v in self.pad_values.items() if k in dims}
        return BreakableGraphs(self.model, dynamic_arg_dims=dims, capture_sizes=self._capture_sizes(),
                               pad_values=pad_values, capture_on_demand=True)

    def _serve(self, arguments: dict[str, Any], args, kwargs):
        # Inference only: traced and run without autograd, whatever the caller's grad mode.
        with torch.no_grad():
            if self.graphs is not None:
                return self.graphs.run(arguments)
            return self._run(*args, **kwargs)

    def _routed(self, arguments: dict[str, Any], args, kwargs, refusal: InputMismatchError):
        for other in self._other_ranges:
            if other.contract.accepts(arguments):
                return other._serve(arguments, args, kwargs)
        covered = ", ".join(f"{r.low}-{r.high}" for r in self.ranges)
        missing = f"; sizes {', '.join(f'{a}-{b}' for a, b in self._uncovered)} are not covered" \
            if self._uncovered else ""
        raise InputMismatchError(f"{refusal}. No compile range serves this call either (they cover make_inputs "
                                 f"sizes {covered}{missing})") from None

    def _record(self, arguments: dict[str, Any]) -> None:
        name, dim = self._size_of
        size = arguments[name].shape[dim]
        if self.uniform_decode is None:
            self.recorder.add("calls", size)
        else:
            self.recorder.add("uniform_decode" if self.uniform_decode(arguments) else "other", size)

    def _call_arguments(self, arguments: dict[str, Any]):
        bound = inspect.BoundArguments(self._signature, arguments)   # positional-only and *args stay positional
        with torch.no_grad():
            return self._run(*bound.args, **bound.kwargs)

    def _bind(self, args, kwargs) -> dict[str, Any]:
        names = self._keyword_names
        if names is not None and not args and len(kwargs) == len(names) and kwargs.keys() == names.keys():
            # Every parameter by keyword (a serving loop's call): what `Signature.bind` returns, in a tenth of its
            # host time.
            return {name: kwargs[name] for name in names}
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    # ---- the one trace (or a saved one) ----
    def _start(self, args, kwargs):
        """The first call: load the saved trace of this model and input contract, else trace (and save) it; then
        build the contract and, on CUDA, the graph dispatcher, and answer the call. With several ranks, each
        checks in with the others between building its pieces and its first run (`vgc.distributed`)."""
        check_in = StartCheckIn()
        try:
            return self._start_checked_in(args, kwargs, check_in)
        except _NotSaved:   # a tiered start that compiles in the background: no rank has failed
            raise
        except BaseException as e:
            check_in.failed(e)   # no effect once this rank has reported ready
            raise

    def _start_checked_in(self, args, kwargs, check_in: StartCheckIn):
        start = time.perf_counter()
        arguments = self._bind(args, kwargs)
        mode = self.config.dynamic_shapes_config.type
        dynamic = dynamic_dims(arguments, self.dynamic_arg_dims)
        specs = argument_specs(arguments, dynamic)   # refuses, before any compile, what it could not check later
        device = _device_of(arguments.values())
        if self._graph_mode(device) != CUDAGraphMode.NONE:
            padded_dims(dynamic, arguments)   # a model CUDA graphs cannot pad fails now, not after compiling
        identity = (specs, dynamic, mode.value)
        if self._range_at is not None:   # each compile range past the first is a trace of its own
            identity += (("compile range", self._range_at),)
        session = TraceSession(self.backend, self.model, self._forward, self._signature, arguments, device.type,
                               identity, check_in.ready)
        trace = session.load(args, kwargs)
        if trace is None and self._load_only:
            raise _NotSaved("no saved trace of this model and call that this process can load (the INFO lines "
                            "above say why)")
        if trace is None:
            mark_dynamic_dims(arguments, dynamic, mode, may_specialise=self._range_at is not None)
            trace = session.trace(args, kwargs)
        self.trace_source, out = trace.source, trace.output
        if len(self.backend.graphs) != 1:   # fullgraph=True: Dynamo hands the backend exactly one graph
            raise RuntimeError(f"vgc: expected one Dynamo graph from the trace, got {len(self.backend.graphs)}")
        graph = self.backend.graphs[0]
        contract = InputContract(self._signature, arguments, specs, dynamic, graph.shape_guards,
                                 graph.compiler_guards,
                                 logging.INFO if self.config.compile_ranges_max_size else logging.WARNING)
        self._run = trace.run
        if out is None:   # a saved or captured program has not run yet
            check_in.ready(graph.collectives)
            try:
                with torch.no_grad():
                    out = self._run(*args, **kwargs)
            except BaseException:   # e.g. a token id out of range: the next call starts again, from the cache
                self.backend.graphs.clear()
                raise
        graph_mode, graphs = self._graph_mode(torch.device(graph.device_type)), None
        if self.recorder is not None:
            try:
                self._size_of = next(iter(padded_dims(dynamic, arguments).items()))
            except ValueError as e:
                logger.warning("record: no call size to record (%s)", e)
        if graph_mode != CUDAGraphMode.NONE:
            graphs = GraphDispatcher(self._call_arguments, graph_mode, self._capture_sizes(),
                                     padded_dims(dynamic, arguments), self.pad_values, self.uniform_decode,
                                     self.backend.graph_runtime, arguments, out,
                                     graph.input_check.by_argument_name() if graph.input_check else None,
                                     self.config.uniform_decode_query_len)
        self.contract, self.graphs = contract, graphs   # together: a call sees a whole traced model or none
        total = time.perf_counter() - start
        self._seconds.update(trace.seconds, first_call=total)
        logger.info("%s, compiled %d and loaded %d artifacts in %.2f s",
                    "loaded the saved trace" if self.trace_source == "saved" else "traced once",
                    graph.counters.inductor_compiles, graph.counters.artifacts_loaded, total)
        return out

    def _capture_sizes(self) -> list[int]:
        """The user's capture sizes; else, with a traffic profile, those it makes worth capturing; else the
        default list."""
        config = self.config
        if config.cudagraph_capture_sizes is not None or self.profile is None:
            return config.resolved_capture_sizes()
        sizes = traffic.capture_sizes_from_profile(self.profile, config.cudagraph_max_graphs,
                                                   config.max_cudagraph_capture_size)
        logger.info("capture sizes from the traffic profile %s: %s", config.cudagraph_traffic_profile, sizes)
        return sizes

    def _graph_mode(self, device: torch.device) -> CUDAGraphMode:
        """The CUDA-graph mode `vgc.compile` runs with on `device`: NONE off CUDA."""
        return self.config.resolved_cudagraph_mode(device.type) if device.type == "cuda" else CUDAGraphMode.NONE

    # ---- warm-up ----
    def warmup(self, make_inputs: Callable[[int], Any], trace_size: int | None = None,
               make_decode_inputs: Callable[[int], Any] | None = None) -> dict[str, Any]:
        """Trace once, compile or load every piece for the symbolic size and every compile size, capture every
        CUDA graph (largest first). Nothing compiles after the trace, and nothing captures after warm-up.

        `make_inputs(n)` returns the model's kwargs (a dict), args (a tuple or list) or its one argument (a
        tensor, or any other value) for a dynamic size `n`;
        `make_decode_inputs(n)`, when given, makes the uniform decode batches FULL graphs are captured with.
        With `compile_ranges_max_size`, sizes 2 to it are covered by a trace per range of the model's size
        conditions (`vgc.capture.compile_ranges`), each range capturing the capture sizes inside it.
        """
        if self.warmed_up or self.tier == "eager":
            return self.stats()
        if self.tiered and self.contract is None:
            self._warming = True
            try:
                return self._start_tiered(make_inputs, trace_size, make_decode_inputs)
            finally:
                self._warming = False
        self._warming = True
        try:
            return self._warmup(make_inputs, trace_size, make_decode_inputs)
        finally:
            self._warming = False

    def _warmup(self, make_inputs: Callable[[int], Any], trace_size: int | None,
                make_decode_inputs: Callable[[int], Any] | None) -> dict[str, Any]:
        start = time.perf_counter()
        size = self._trace_size(trace_size)
        high = self.config.compile_ranges_max_size
        if high and not 2 <= size <= high:
            raise ValueError(f"compile_ranges_max_size={high} must be at least the trace size {size} (and >= 2); "
                             f"raise it or pass warmup(..., trace_size=<a size in 2..{high}>)")
        if self.contract is None:
            self._call_with(make_inputs(size))
        if self.config.compile_ranges_max_size:
            self._trace_ranges(make_inputs, size)
        for size in self.config.compile_sizes:
            self._call_with(make_inputs(size))
        capture_start = time.perf_counter()
        for model in [self, *self._other_ranges]:
            model._capture(make_inputs, make_decode_inputs or make_inputs)
            model.warmed_up = True
        if self.graphs is not None or any(m.graphs is not None for m in self._other_ranges):
            self._seconds["cudagraph_capture"] = time.perf_counter() - capture_start
        self._seconds["warmup"] = time.perf_counter() - start
        return self.stats()

    def _trace_ranges(self, make_inputs: Callable[[int], Any], size: int) -> None:
        """Compile ranges: trace again past each end of the sizes this trace serves, until 2 to
        `compile_ranges_max_size` are covered (`vgc.capture.compile_ranges`)."""
        high = self.config.compile_ranges_max_size

        def accepts(model: CompiledModel, n: int) -> bool:
            try:
                inputs = make_inputs(n)
            except Exception:   # a size the caller's inputs cannot be made at
                return False
            return model.contract.accepts(self._inputs_as_arguments(inputs))

        def trace_at(n: int, index: int) -> CompiledModel | None:
            model = CompiledModel(self.model, self.config, self.dynamic_arg_dims, self.pad_values,
                                  self.uniform_decode)
            model._range_at = n
            try:
                inputs = make_inputs(n)
            except Exception as e:
                logger.warning("compile ranges: make_inputs(%d) failed (%s: %s)", n, type(e).__name__, e)
                return None
            try:
                model._call_with(inputs)
            except RankFailedError:   # another rank failed: every rank stops, as at the first trace
                raise
            except Exception as e:   # e.g. a size the model itself refuses
                logger.warning("compile ranges: the trace at size %d failed (%s: %s)", n, type(e).__name__, e)
                return None
            return model

        if not accepts(self, size):
            logger.warning("compile ranges: the trace (made by a call before warmup()) does not serve "
                           "make_inputs(%d); no ranges traced. Call warmup() first, or pass trace_size=<a size "
                           "it serves>", size)
            return
        self.ranges, self._uncovered = compile_ranges.cover(self, size, 2, high, accepts, trace_at)
        self._other_ranges = [r.model for r in self.ranges if r.model is not self]
        if self.graphs is not None:
            # Each capture size goes to the range that serves it (the first, in routing order, whose contract takes
            # it), size 1 and sizes past the maximum included, so a call pads only within its own range.
            routed = [self, *self._other_ranges]
            owner = {c: next((m for m in routed if accepts(m, c)), None) for c in self.graphs.capture_sizes}
            for model in routed:
                model.graphs = model.graphs.restricted([c for c, m in owner.items() if m is model])
        logger.info("compile ranges: %d trace(s) cover sizes %s%s", len(self.ranges),
                    ", ".join(f"{r.low}-{r.high}" for r in self.ranges),
                    f"; not covered: {', '.join(f'{a}-{b}' for a, b in self._uncovered)}" if self._uncovered
                    else "")

    def _capture(self, make_inputs: Callable[[int], Any], make_decode_inputs: Callable[[int], Any]) -> None:
        if self.graphs is not None:
            as_arguments = lambda maker: lambda n: self._as_arguments(maker(n))  # noqa: E731
            budget = self.config.cudagraph_memory_budget_mb
            order = None if self.profile is None else \
                traffic.value_order(traffic.decoder_histogram(self.profile), self.graphs.capture_sizes)
            self.graphs.capture_all(as_arguments(make_inputs), as_arguments(make_decode_inputs),
                                    None if budget is None else budget * 2 ** 20, order)

    def _trace_size(self, trace_size: int | None) -> int:
        """The size warm-up traces at: the caller's, else 16 or the largest compile size."""
        return trace_size if trace_size is not None else max([16, *self.config.compile_sizes])

    def _call_with(self, inputs):
        args, kwargs = _as_call(inputs)
        return self(*args, **kwargs)

    def _inputs_as_arguments(self, inputs) -> dict[str, Any]:
        return self._bind(*_as_call(inputs))

    def _as_arguments(self, inputs) -> dict[str, Any]:
        arguments = self._inputs_as_arguments(inputs)
        self.contract.check(arguments)
        return arguments

    def stats(self) -> dict[str, Any]:
        """This model's pieces, artifacts, seconds per phase and graphs; `counters` is the process total."""
        report = self.backend.stats()
        report.update(warmed_up=self.warmed_up, seconds=dict(self._seconds), counters=counters.as_dict(),
                      dynamic_dims=self.contract.report() if self.contract is not None else {},
                      cudagraphs=self.graphs.report() if self.graphs is not None else None)
        if self.tiered:
            report.update(tier=self.tier, tier_calls=dict(self._tier_calls), background_compile=self.background_compile,
                          background_seconds=dict(self._background_phases), background_failure=self.background_failure)
        if self.ranges:
            report["compile_ranges"] = [r.report() for r in self.ranges]
            report["compile_ranges_uncovered"] = [list(u) for u in self._uncovered]
        return report


def _as_config(config: CompilationConfig | dict | None) -> CompilationConfig:
    """A CompilationConfig from what `vgc.compile` was given: a config, a dict of its fields (the same
    keys `torch.compile(..., options=...)` takes) or None."""
    if config is None:
        return CompilationConfig()
    if isinstance(config, CompilationConfig):
        return config
    if isinstance(config, dict):
        return CompilationConfig.from_options(config)
    raise TypeError(f"config must be a vgc.CompilationConfig or a dict of its fields, got {type(config).__name__}")


def compile(model: Callable, config: CompilationConfig | dict | None = None,
            dynamic_arg_dims: dict[str, DimSpec] | None = None, pad_values: dict[str, Any] | None = None,
            uniform_decode: Callable[[dict], bool] | None = None, record: str | None = None,
            tiered: bool = False) -> CompiledModel:
    """Compile `model` for serving: one Dynamo trace, guards replaced by cheap input checks. `config` is a
    `CompilationConfig` or a dict of its fields (`{"compile_sizes": [1, 8]}`).

    `dynamic_arg_dims` maps argument names to their dynamic dims (default: dim 0 of every top-level tensor
    argument): `{"x": 0}`, `{"x": [0, 1]}`, `{"x": {0: "tokens"}}` (a shape id); for a list, tuple, dict or
    dataclass argument, `{"kv": 2}` marks dim 2 of every tensor in it and `{"kv": {0: 2}}`, `{"kv": {"*": 2}}`,
    `{"meta": {"lens": 0}}` address its parts by index, key or field ("*": any). Arguments vgc cannot check on
    each call (objects other than tensors, Python scalars and those containers) are refused at the first call.
    With CUDA graphs, `pad_values` says how to pad each input up to a capture size (a number, default 0, or
    "edge" to repeat the last entry); without it, only calls of exactly a capture size replay graphs
    and `uniform_decode(arguments) -> bool` says which calls FULL graphs serve (FULL_AND_PIECEWISE needs it).
    `record=PATH` writes a traffic profile there: how many calls had each size (tokens, the first padded dim),
    uniform decode or not; it is written every 30 s while calls come, when the model is dropped and at exit.
    `cudagraph_traffic_profile=PATH` in a later start's config chooses capture sizes from it.
    `tiered=True`: a `warmup()` that finds no saved trace returns at once, and the model itself serves while a
    child process traces, compiles and saves it (the model's code and tensor shapes go there, not its weights);
    the first call after that loads it from the cache, captures its graphs and serves compiled from then on
    (`stats()["tier"]`, `["tier_calls"]`). A failed background compile leaves the model itself serving, warned.
    The tiers start at `warmup()`, whose `make_inputs` the swap runs again; a first call made before any
    `warmup()` traces and compiles in this process, as without `tiered`.
    """
    return CompiledModel(model, config, dynamic_arg_dims, pad_values, uniform_decode, record, tiered)


def compile_in_background(directory: str) -> None:
    """The child process of a tiered start (`vgc.background_compile`): trace, compile and save the model's first
    call to the cache, then report what it did."""
    entered = time.time()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")
    payload = read_payload(directory)
    compiled = CompiledModel(payload["model"], **payload["options"])
    compiled._seconds["read_payload"] = time.time() - entered
    compiled(*payload["args"], **payload["kwargs"])
    write_result(directory, {"trace_source": compiled.trace_source, "seconds": compiled._seconds,
                             "counters": counters.as_dict(), "entered": entered})


def _device_of(values) -> torch.device:
    """The device of a call's first tensor, inside containers too (CPU when it has none)."""
    return _compat.device_from_inputs([t for value in values for _, t in argument_tensors(value)])


def _as_call(inputs) -> tuple[tuple, dict]:
    """A `make_inputs` result as (args, kwargs): a dict is keywords, a tuple or list positional arguments, and a
    bare tensor (or any other value) the model's one argument, not a sequence of its rows."""
    if isinstance(inputs, dict):
        return (), inputs
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}

