"""The torch.compile backend: Dynamo graph → split at splitting ops → Inductor per piece (cached) → runtime."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from vgc import _compat
from vgc.cache import debug_files
from vgc.cache.entry import open_store
from vgc.compiler import compile_piece, find_size_source, free_symbols, piece_key, unwrap_single
from vgc.config import CompilationConfig, CUDAGraphMode
from vgc.counters import Counters, counters
from vgc.cudagraph.piece import CUDAGraphPiece, mutated_inputs
from vgc.cudagraph.runtime import GraphRuntime
from vgc.guards import snapshot_shape_guards
from vgc.piecewise import CompiledPiece
from vgc.split import Piece, split_graph

logger = logging.getLogger("vgc")


class CompileAfterWarmupError(RuntimeError):
    """Raised when Dynamo asks a `vgc.compile` model, already traced once, to trace and compile again."""


@dataclass
class GraphRecord:
    """What one backend invocation built, for `stats()`, the demo and tests."""
    pieces: list[Piece]
    compiled: dict[str, CompiledPiece]
    unique_keys: set[str]
    cache_dir: str | None
    computation_graph: str | None
    counters: Counters                 # this graph's work; its parent is the model's record
    seconds: dict[str, float] = field(default_factory=dict)
    device_type: str = "cpu"
    shape_guards: list = field(default_factory=list)   # Dynamo's shape guards before Inductor added its own

    @property
    def artifacts_compiled(self) -> int:
        return self.counters.inductor_compiles

    @property
    def artifacts_loaded(self) -> int:
        return self.counters.artifacts_loaded


def _piece_example_inputs(split_gm: fx.GraphModule, example_inputs: list) -> dict[str, tuple]:
    """Run the split graph on fake tensors to learn each piece's (symbolic) inputs."""
    fake_mode = _compat.detect_fake_mode(example_inputs)
    recorded: dict[str, tuple] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target, args, kwargs):
            recorded[target] = args
            return super().call_module(target, args, kwargs)

    if fake_mode is None:  # called outside Dynamo (e.g. directly on a GraphModule): trace with real inputs
        Recorder(split_gm).run(*example_inputs)
        return recorded
    fake_inputs = _compat.fake_inputs(fake_mode, example_inputs)
    with fake_mode:
        Recorder(split_gm).run(*fake_inputs)
    return recorded


def _module_state_arguments(split_gm: fx.GraphModule, example_inputs: list) -> dict[str, list[bool]]:
    """Per piece, which arguments are the model's weights or buffers: their address never changes."""
    placeholders = [n for n in split_gm.graph.nodes if n.op == "placeholder"]
    state = {}
    for node, value in zip(placeholders, example_inputs):
        name = _compat.placeholder_source_name(node)
        state[node] = isinstance(value, torch.nn.Parameter) or "_parameters[" in name or "_buffers[" in name
    return {node.target: [isinstance(a, fx.Node) and state.get(a, False) for a in node.args]
            for node in split_gm.graph.nodes if node.op == "call_module"}


def _call_custom_ops_directly(module: fx.GraphModule) -> None:
    """In an eager piece, call Python custom ops' bodies instead of dispatching to them (no tracing happens
    there, and the dispatcher's bookkeeping is pure host overhead between CUDA graphs)."""
    changed = False
    for node in module.graph.nodes:
        if node.op == "call_function":
            kernel = _compat.direct_kernel(node.target)
            if kernel is not None:
                node.target = kernel
                changed = True
    if changed:
        module.recompile()


def _report_compiler_guards(before: list, example_inputs: list) -> None:
    """Inductor may assume more about the sizes than Dynamo did (e.g. `s0 <= 4096` to skip a precise-sum helper).
    Those guards are dropped like Dynamo's; say which, since sizes beyond them run code compiled under them."""
    known = {str(expr) for expr, _, _ in before}
    added = [(expr, sources) for expr, _, sources in snapshot_shape_guards(_compat.detect_fake_mode(example_inputs))
             if str(expr) not in known]
    for expr, sources in added:
        logger.warning("vgc: Inductor compiled the symbolic-size code assuming %s (%s); larger sizes run it anyway",
                       expr, ", ".join(f"{s}={name}" for s, name in sources.items()))


def _copy_graph_outputs(forward: Callable, runtime: GraphRuntime) -> Callable:
    """Drop-in callers may keep outputs across calls: never hand them memory the next replay overwrites."""
    def call(*args):
        out = forward(*args)
        return tuple(o.clone() if isinstance(o, torch.Tensor) and runtime.is_stable(o) else o for o in out)
    return call


class VgcBackend:
    """`torch.compile(model, backend=vgc.VgcBackend(config))`. One instance may compile several graphs.

    `trace_once=True` is the backend of `vgc.compile`, which drops Dynamo's guards and owns the calls. It then
    compiles only inside `tracing()`, the scope of its owner's single trace (any other request to compile is a
    `CompileAfterWarmupError`), warns of the size assumptions Inductor adds (nothing checks them once guards are
    gone), leaves FULL graphs and output lifetime to the caller, and captures piece graphs only inside
    `graph_runtime.capturing()`. Without it (drop-in), Dynamo's guards stay, piece graphs capture on a size's
    second call and outputs are cloned out of graph memory.
    """

    def __init__(self, config: CompilationConfig | None = None, *, trace_once: bool = False):
        self.config = config if config is not None else CompilationConfig()
        self.trace_once = trace_once
        self.graphs: list[GraphRecord] = []
        self.counters = Counters.child_of(counters)   # this model's work; vgc.counters stays the process total
        # Built up front, used only by graphs on CUDA with a piece-graph mode (the device is known per graph).
        self.graph_runtime = GraphRuntime(self.config.resolved_capture_sizes(), debug=self.config.debug,
                                          capture_on_demand=not trace_once, counters=self.counters)
        self._memo: dict[str, Callable] = {}   # artifact name -> compiled callable, shared by identical pieces
        self._seen_keys: set[str] = set()
        self._tracing = False

    @contextlib.contextmanager
    def tracing(self):
        """The scope of a trace-once model's trace: the only place it compiles.

        A retried trace (the first one failed, e.g. Dynamo rejected its graph) replaces the graphs of the failed
        one; when the retry reuses the code Dynamo kept from it, those graphs stay.
        """
        before, self._tracing = len(self.graphs), True
        try:
            yield
        finally:
            self._tracing = False
            if len(self.graphs) > before:
                del self.graphs[:before]

    def __call__(self, gm: fx.GraphModule, example_inputs: list, options: dict | None = None,
                 mode: str | None = None) -> Callable:
        try:
            if options or mode:
                raise ValueError("pass options through CompilationConfig when using a VgcBackend instance "
                                 "(torch.compile(..., options=...) is for backend='vgc')")
            if self.trace_once and not self._tracing:
                raise CompileAfterWarmupError(
                    "vgc: Dynamo asked to trace and compile a vgc.compile model again; it traces once, on its first "
                    "call, and never compiles after that, warm-up or not. With guards dropped this only happens "
                    "when Dynamo lost the compiled code (torch._dynamo.reset(), a cache-size limit) or the model is "
                    "called through another entry; build and warm up a new CompiledModel.")
            return self._compile_graph(gm, example_inputs)
        except (ValueError, CompileAfterWarmupError) as e:
            raise _compat.through_dynamo(e) from e

    def _compile_graph(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        record = GraphRecord(pieces=[], compiled={}, unique_keys=set(), cache_dir=None, computation_graph=None,
                             counters=Counters.child_of(self.counters),
                             device_type=_compat.device_from_inputs(example_inputs).type,
                             shape_guards=snapshot_shape_guards(_compat.detect_fake_mode(example_inputs)))
        record.counters.add(dynamo_traces=1)
        seconds = record.seconds
        graph_runtime = self._piece_graph_runtime(record.device_type)

        start = time.perf_counter()
        store = open_store(self.config, record.device_type, _compat.traced_code_objects())
        seconds["cache_key"] = time.perf_counter() - start

        start = time.perf_counter()
        split_gm, record.pieces = split_graph(gm, self.config.splitting_ops)
        piece_inputs = _piece_example_inputs(split_gm, example_inputs)
        module_state = _module_state_arguments(split_gm, example_inputs)
        seconds["split"] = time.perf_counter() - start

        start = time.perf_counter()
        for piece in record.pieces:
            record.counters.add(pieces=1, splitting_pieces=int(piece.is_splitting))
            if piece.is_splitting:
                _call_custom_ops_directly(piece.module)
                # Bound forward skips nn.Module.__call__: attention pieces run eagerly with no hook overhead.
                split_gm.__dict__[piece.name] = _compat.generated_forward(piece.module)
                continue
            if piece.name not in piece_inputs:  # dead piece (never called)
                continue
            compiled = self._compile_piece(piece, list(piece_inputs[piece.name]), store, record.counters)
            record.compiled[piece.name] = compiled
            record.unique_keys.add(compiled.key)
            split_gm.__dict__[piece.name] = compiled if graph_runtime is None else \
                CUDAGraphPiece(compiled, module_state[piece.name], mutated_inputs(piece.module), graph_runtime)
        seconds["compile"] = time.perf_counter() - start
        if self.trace_once:
            _report_compiler_guards(record.shape_guards, example_inputs)

        record.cache_dir = str(store.directory) if store.directory is not None else None
        record.computation_graph = debug_files.write_computation_graph(store, split_gm, record.pieces)
        debug_files.expect_transformed_code(store)
        self.graphs.append(record)
        logger.info("vgc: graph %d: %d pieces (%d unique compiled), %d compiled, %d loaded in %.2f s%s",
                    len(self.graphs) - 1, len(record.pieces), len(record.unique_keys), record.artifacts_compiled,
                    record.artifacts_loaded, seconds["compile"],
                    f"; cache {record.cache_dir}" if record.cache_dir else "")
        # The generated forward frees each intermediate after its last use (FX codegen), with no Module call.
        if graph_runtime is not None and not self.trace_once:
            return _copy_graph_outputs(split_gm.forward, graph_runtime)
        return split_gm.forward

    def _compile_piece(self, piece: Piece, example_inputs: list, store, graph_counters: Counters) -> CompiledPiece:
        inductor_config = self.config.inductor_compile_config
        static_config = {**inductor_config, **self.config.compile_sizes_inductor_config}
        key = piece_key(piece.module, example_inputs,
                        extra=repr((sorted(inductor_config.items()), sorted(static_config.items()))))
        size_source = find_size_source(example_inputs)
        single = not _compat.graph_returns_tuple(piece.module)
        if key not in self._seen_keys:
            self._seen_keys.add(key)
            graph_counters.add(unique_pieces=1)

        def build(size: int | None) -> Callable:
            name = f"piece-{key}-{'dynamic' if size is None else size}"
            fn = self._memo.get(name)
            if fn is None:
                fetched = store.load_or_compile(
                    name,
                    lambda: compile_piece(piece.module, example_inputs, size=size, size_source=size_source,
                                          inductor_config=inductor_config if size is None else static_config),
                    meta={"piece": piece.name, "size": size})
                graph_counters.add(**fetched.counts)
                fn = unwrap_single(fetched.artifact) if single else fetched.artifact
                self._memo[name] = fn
            return fn

        dynamic_fn = build(None)
        static_fns = {}
        if size_source is not None:
            static_fns = {size: build(size) for size in self.config.compile_sizes}
        elif self.config.compile_sizes:
            logger.debug("vgc: %s has no single symbolic size; compile_sizes do not apply to it", piece.name)
        return CompiledPiece(piece.name, key, dynamic_fn, static_fns, size_source,
                             has_symbols=bool(free_symbols(example_inputs)))

    def _piece_graph_runtime(self, device_type: str) -> GraphRuntime | None:
        """The runtime when this graph's compiled pieces get CUDA graphs, else None."""
        mode = self.config.resolved_cudagraph_mode(device_type)
        if mode == CUDAGraphMode.NONE:
            return None
        if device_type != "cuda":
            logger.warning("vgc: cudagraph_mode=%s needs a CUDA device; this %s model runs without CUDA graphs",
                           mode.value, device_type)
            return None
        if not self.trace_once and mode != CUDAGraphMode.PIECEWISE:
            logger.warning("vgc: cudagraph_mode=%s: FULL graphs need vgc.compile (it pads and owns the inputs); "
                           "torch.compile(backend='vgc') captures PIECEWISE graphs only", mode.value)
        return None if mode == CUDAGraphMode.FULL else self.graph_runtime

    def stats(self) -> dict[str, Any]:
        return {
            "graphs": len(self.graphs),
            "pieces": sum(len(g.pieces) for g in self.graphs),
            "unique_compiled_pieces": len(set().union(*(g.unique_keys for g in self.graphs))) if self.graphs else 0,
            "artifacts_compiled": self.counters.inductor_compiles,
            "artifacts_loaded": self.counters.artifacts_loaded,
            "cache_dirs": sorted({g.cache_dir for g in self.graphs if g.cache_dir}),
            "computation_graphs": [g.computation_graph for g in self.graphs if g.computation_graph],
            "model_counters": self.counters.as_dict(per_call=False),
        }


def vgc_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None,
                mode: str | None = None) -> Callable:
    """The backend registered as "vgc": `torch.compile(model, backend="vgc", options={...})`."""
    try:
        if mode is not None:
            raise ValueError(f"backend='vgc' takes no mode (got mode={mode!r}); pass CompilationConfig fields "
                             "through options=..., e.g. options={'compile_sizes': [1, 8]}")
        config = CompilationConfig.from_options(options)
    except ValueError as e:
        raise _compat.through_dynamo(e) from e
    return VgcBackend(config)(gm, example_inputs)
