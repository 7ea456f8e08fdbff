"""`vgc.compile`: trace once with Dynamo, drop its guards, compile everything at warm-up, never compile again."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any, Callable

import torch

from vgc import _compat
from vgc.backend import VgcBackend
from vgc.config import CompilationConfig, CUDAGraphMode, DynamicShapesType
from vgc.cudagraph.dispatch import GraphDispatcher
from vgc.cudagraph.padding import output_tensors
from vgc.cudagraph.runtime import GraphRuntime
from vgc.counters import counters
from vgc.guards import TensorSpec, argument_tensors, build_size_guards, spec_of

logger = logging.getLogger("vgc")

DimSpec = int | list[int] | tuple[int, ...] | dict[int, str]


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


class CompiledModel:
    """What `vgc.compile` returns: call it like the model; `warmup()` first to compile everything up front."""

    def __init__(self, model: Callable, config: CompilationConfig | None = None,
                 dynamic_arg_dims: dict[str, DimSpec] | None = None, pad_values: dict[str, Any] | None = None,
                 uniform_decode: Callable[[dict], bool] | None = None):
        self.model = model
        self.config = config if config is not None else CompilationConfig()
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        self._signature = inspect.signature(forward)
        unknown = sorted(set(dynamic_arg_dims or {}) - set(self._signature.parameters))
        if unknown:
            raise ValueError(f"dynamic_arg_dims names unknown argument(s) {unknown}; "
                             f"the model takes {list(self._signature.parameters)}")
        self.dynamic_arg_dims = dynamic_arg_dims
        self.pad_values = None if pad_values is None else dict(pad_values)
        self.uniform_decode = uniform_decode
        if self.config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE and uniform_decode is None:
            raise ValueError("cudagraph_mode FULL_AND_PIECEWISE needs uniform_decode=<predicate on the call's "
                             "arguments> to tell decode batches (FULL graph) from the rest (PIECEWISE)")
        self.graphs: GraphDispatcher | None = None
        self.backend = VgcBackend(self.config)
        self.backend.record_shape_guards = True
        self._compiled = torch.compile(model, backend=self.backend, fullgraph=True, dynamic=False,
                                       options={"guard_filter_fn": _compat.skip_all_guards})
        self._specs: dict[str, Any] | None = None
        self._dynamic: dict[str, dict[int, str | None]] = {}
        self._size_guards = []
        self._seconds: dict[str, float] = {}
        self.warmed_up = False

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        if self._specs is None:
            return self._trace(args, kwargs)
        arguments = self._bind(args, kwargs)
        self._check(arguments)
        # Inference only: traced and run without autograd, whatever the caller's grad mode.
        with torch.no_grad():
            if self.graphs is not None:
                return self.graphs.run(arguments)
            return self._compiled(*args, **kwargs)

    def _call_arguments(self, arguments: dict[str, Any]):
        bound = inspect.BoundArguments(self._signature, arguments)   # positional-only and *args stay positional
        with torch.no_grad():
            return self._compiled(*bound.args, **bound.kwargs)

    def _bind(self, args, kwargs) -> dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def _dims_for(self, name: str, tensor: torch.Tensor) -> dict[int, str | None]:
        if self.dynamic_arg_dims is None:
            return {0: None} if tensor.dim() > 0 else {}
        spec = self.dynamic_arg_dims.get(name)
        return {} if spec is None else _normalize_dims(name, spec, tensor.dim())

    def _trace(self, args, kwargs):
        arguments = self._bind(args, kwargs)
        mode = self.config.dynamic_shapes_config.type
        specs: dict[str, Any] = {}
        for name, value in arguments.items():
            for suffix, tensor in argument_tensors(value):
                dims = self._dims_for(name, tensor) if suffix == "" else {}
                self._dynamic[name + suffix] = dims
                self._mark(name + suffix, tensor, dims, mode)
            specs[name] = spec_of(value, f"argument {name!r}",
                                  lambda t, name=name: TensorSpec.of(t, self._dynamic[name]))
        if not any(self._dynamic.values()):
            logger.warning("vgc: no dynamic dims were marked; the model is compiled for these exact shapes")
        start = time.perf_counter()
        compiled_before, loaded_before = counters.inductor_compiles, counters.artifacts_loaded
        # Without duck sizing, equal sizes at trace time stay separate symbols: only relations the model really
        # needs (input_ids and positions broadcast together) become guards, and those are checked per call.
        with _compat.backed_size_oblivious(mode == DynamicShapesType.BACKED_SIZE_OBLIVIOUS), \
                _compat.no_duck_shape(), torch.no_grad():
            out = self._compiled(*args, **kwargs)
        total = time.perf_counter() - start
        self._specs = specs
        self._size_guards = build_size_guards([g for graph in self.backend.graphs for g in graph.shape_guards])
        self._setup_graphs(arguments, out)
        backend_s = sum(sum(g.seconds.values()) for g in self.backend.graphs)
        self._seconds.update(first_call=total, backend=backend_s, dynamo_trace_and_run=total - backend_s)
        logger.info("vgc: traced once, compiled %d and loaded %d artifacts in %.2f s",
                    counters.inductor_compiles - compiled_before, counters.artifacts_loaded - loaded_before, total)
        return out

    @staticmethod
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

    def _check(self, arguments: dict[str, Any]) -> None:
        for name, spec in self._specs.items():
            value = arguments[name]
            if not spec.ok(value):   # the message is built only for a call that fails
                spec.check(f"argument {name!r}", value)
        for guard in self._size_guards:
            guard.check(arguments)

    # ---- warm-up ----
    def warmup(self, make_inputs: Callable[[int], Any], trace_size: int | None = None,
               make_decode_inputs: Callable[[int], Any] | None = None) -> dict[str, Any]:
        """Trace once, compile or load every piece for the symbolic size and every compile size, capture every
        CUDA graph (largest first), then seal: nothing compiles or captures afterwards.

        `make_inputs(n)` returns the model's kwargs (a dict) or args (a tuple) for a dynamic size `n`;
        `make_decode_inputs(n)`, when given, makes the uniform decode batches FULL graphs are captured with.
        """
        if self.warmed_up:
            return self.stats()
        start = time.perf_counter()
        if self._specs is None:
            size = trace_size if trace_size is not None else max([16, *self.config.compile_sizes])
            self._call_with(make_inputs(size))
        for size in self.config.compile_sizes:
            self._call_with(make_inputs(size))
        if self.graphs is not None:
            capture_start = time.perf_counter()
            as_arguments = lambda maker: lambda n: self._as_arguments(maker(n))  # noqa: E731
            self.graphs.capture_all(as_arguments(make_inputs), as_arguments(make_decode_inputs or make_inputs))
            self._seconds["cudagraph_capture"] = time.perf_counter() - capture_start
        self.backend.sealed = True
        self.warmed_up = True
        self._seconds["warmup"] = time.perf_counter() - start
        return self.stats()

    def _call_with(self, inputs):
        return self(**inputs) if isinstance(inputs, dict) else self(*inputs)

    def _as_arguments(self, inputs) -> dict[str, Any]:
        arguments = self._bind((), inputs) if isinstance(inputs, dict) else self._bind(inputs, {})
        self._check(arguments)
        return arguments

    def _setup_graphs(self, arguments: dict[str, Any], traced_output) -> None:
        """After the trace: the CUDA-graph dispatcher, when the model runs on CUDA and a graph mode is on."""
        device_type = self.backend.graphs[0].device_type if self.backend.graphs else "cpu"
        mode = self.config.resolved_cudagraph_mode(device_type)
        if mode == CUDAGraphMode.NONE or device_type != "cuda":
            return
        padded = {}
        for name, dims in self._dynamic.items():
            if not dims or "[" in name:
                continue
            if len(dims) > 1:
                raise ValueError(f"CUDA graphs pad one dynamic dim per input, but {name!r} has dims {sorted(dims)}")
            padded[name] = next(iter(dims))
        if not padded:
            raise ValueError("CUDA graphs need at least one dynamic input to pad (see dynamic_arg_dims)")
        runtime = self.backend.graph_runtime or GraphRuntime(self.config.resolved_capture_sizes(), self.config.debug)
        runtime.capture_allowed = False   # vgc.compile captures in warmup() only, with its own padded buffers
        self.graphs = GraphDispatcher(self._call_arguments, mode, self.config.resolved_capture_sizes(), padded,
                                      self.pad_values, self.uniform_decode, runtime, size_arg=next(iter(padded)))
        self.graphs.trace_outputs = ([t.shape for t in output_tensors(traced_output)],
                                     self.graphs.batch_size(arguments))

    def stats(self) -> dict[str, Any]:
        report = self.backend.stats()
        report.update(warmed_up=self.warmed_up, seconds=dict(self._seconds), counters=counters.as_dict(),
                      dynamic_dims={k: sorted(v) for k, v in self._dynamic.items() if v},
                      cudagraphs=self.graphs.report() if self.graphs is not None else None)
        return report


def compile(model: Callable, config: CompilationConfig | None = None,
            dynamic_arg_dims: dict[str, DimSpec] | None = None, pad_values: dict[str, Any] | None = None,
            uniform_decode: Callable[[dict], bool] | None = None) -> CompiledModel:
    """Compile `model` for serving: one Dynamo trace, guards replaced by cheap input checks.

    `dynamic_arg_dims` maps argument names to their dynamic dims (default: dim 0 of every tensor argument).
    With CUDA graphs, `pad_values` says how to pad each input up to a capture size (a number, default 0, or
    "edge" to repeat the last entry); without it, only calls of exactly a capture size replay graphs
    and `uniform_decode(arguments) -> bool` says which calls FULL graphs serve (FULL_AND_PIECEWISE needs it).
    """
    return CompiledModel(model, config, dynamic_arg_dims, pad_values, uniform_decode)
