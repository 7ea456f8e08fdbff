"""The torch.compile backend: Dynamo graph → split at splitting ops → Inductor per piece (cached) → runtime."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from vgc import _compat, aliasing, log
from vgc.aliasing import mutated_inputs
from vgc.cache import debug_files
from vgc.cache.entry import open_store
from vgc.cache.keys import traced_source_files
from vgc.cache.store import Fetched
from vgc.capture import request_checks
from vgc.capture.model_state import StateTensor
from vgc.capture.size_guards import snapshot_shape_guards
from vgc.config import CompilationConfig, CUDAGraphMode, DEFAULT_SPLITTING_OPS, PieceBackend
from vgc.counters import Counters, counters
from vgc.cudagraph.dropin import DropInGraphs, full_graph_blocker, GraphInputs
from vgc.cudagraph.piece import CUDAGraphPiece
from vgc.cudagraph.runtime import GraphRuntime
from vgc.ops.attention import lengths_read_once
from vgc.ops.collectives import collective_calls
from vgc.passes.manager import pass_manager
from vgc.passes.sibling_matmul import fuse_sibling_linears, is_fused_weight
from vgc.piecewise.compiled_piece import CompiledPiece
from vgc.piecewise.inductor import compile_piece, find_size_source, free_symbols, piece_key, unwrap_single
from vgc.piecewise.plan import GraphPlan, MissingArtifact, PiecePlan
from vgc.piecewise.split import (attention_like_ops, check_splitting_ops, eager_attention_count, is_model_state,
                                 lay_out_eager_results, Piece, SDPA, sdpa_reads_a_kv_cache, split_graph)

logger = logging.getLogger("vgc")

INFERENCE_ONLY = ("vgc compiles for inference: no gradient flows back through a model compiled with vgc. Call it "
                  "under torch.no_grad() or torch.inference_mode() (or call model.requires_grad_(False)); to train, "
                  "use torch.compile's default backend")


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
    compiler_guards: list = field(default_factory=list)   # what Inductor assumed on top (trace-once only)
    input_check: request_checks.InputIdCheck | None = None   # token ids checked before each call (None: none)
    full_graphs: DropInGraphs | None = None   # drop-in FULL modes: the graph's FULL CUDA graphs
    collectives: int = 0   # calls that talk to other ranks: every rank must run the graph together



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
    # Dynamo's own fake values where the placeholders carry them: a real tensor among the example inputs (torch
    # 2.11's AOT capture hands some over) would become a fake of static shape, and meeting the symbolic ones it
    # would pin their sizes.
    placeholders = [n for n in split_gm.graph.nodes if n.op == "placeholder"]
    traced = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    fake_inputs = _compat.fake_inputs(fake_mode, [
        value if isinstance(value, torch.Tensor) and _compat.is_fake(value) and isinstance(x, torch.Tensor)
        and value.dim() == x.dim() else x
        for x, value in zip(example_inputs, traced + [None] * (len(example_inputs) - len(traced)))])
    with _compat.fake_propagation(fake_mode):
        Recorder(split_gm).run(*fake_inputs)
    return recorded


def _module_state_arguments(split_gm: fx.GraphModule, example_inputs: list) -> dict[str, list[bool]]:
    """Per piece, which arguments are the model's weights or buffers (fused weights included)."""
    placeholders = [n for n in split_gm.graph.nodes if n.op == "placeholder"]
    state = {node: is_model_state(node, value) for node, value in zip(placeholders, example_inputs)}
    state.update((node, True) for node in split_gm.graph.nodes if is_fused_weight(node))
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


class _InferenceOnly(torch.autograd.Function):
    """Gives vgc's outputs a backward that raises `INFERENCE_ONLY`. Without it a backward through them fails with
    torch's "does not require grad", or, when they are summed with other terms, succeeds and leaves the model's
    parameters silently without gradients."""

    @staticmethod
    def forward(ctx, outputs: tuple, anchor: torch.Tensor):
        # The outputs come in as a constant, not as inputs: an input returned as-is would become a view, and
        # autograd forbids in-place writes to views made in a custom Function.
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(INFERENCE_ONLY)


def _grad_anchor(example_inputs: list) -> int | None:
    """With autograd on, the position of the first input that requires grad (the model's parameters are graph
    inputs), else None. Dynamo guards on both, so the compiled graph only meets calls alike."""
    if not torch.is_grad_enabled():
        return None
    return next((i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and x.requires_grad), None)


def _aliases_input(node) -> bool:
    """The graph returns one of its inputs, or what may be a view of one."""
    base = aliasing.storage_base(node)
    return isinstance(base, fx.Node) and base.op == "placeholder"


def _raise_on_backward(forward: Callable, gm: fx.GraphModule, anchor: int) -> Callable:
    """`forward` run without autograd (compiled pieces record none anyway; eager pieces then record none either),
    its outputs given `_InferenceOnly`'s backward through the anchor input, which makes them require grad, as
    eager's would. Outputs that are inputs or their views stay untouched: the caller's tensor itself must not
    change, and autograd would forbid in-place writes to a view that went through the Function."""
    outputs = gm.graph.output_node().args[0]
    if not isinstance(outputs, (tuple, list)):   # Dynamo's graphs return a tuple; a hand-made one may not
        return forward
    marked = [i for i, node in enumerate(outputs)
              if isinstance(node, fx.Node) and not _aliases_input(node) and node not in outputs[:i]]

    def call(*args):
        if not torch.is_grad_enabled():
            return forward(*args)
        with torch.no_grad():
            out = list(forward(*args))
        tensors = [i for i in marked if isinstance(out[i], torch.Tensor)]
        if tensors:
            for i, tensor in zip(tensors, _InferenceOnly.apply(tuple(out[i] for i in tensors), args[anchor])):
                out[i] = tensor
        return tuple(out)
    return call


def _copy_graph_outputs(forward: Callable, runtime: GraphRuntime) -> Callable:
    """Drop-in callers may keep outputs across calls: never hand them memory the next replay overwrites."""
    def call(*args):
        out = forward(*args)
        return tuple(o.clone() if isinstance(o, torch.Tensor) and runtime.is_stable(o) else o for o in out)
    return call


class VgcBackend:
    """`torch.compile(model, backend=vgc.VgcBackend(config))`. One instance may compile several graphs.

    This is the drop-in backend: Dynamo's guards stay, piece graphs capture on a size's second call, FULL graphs
    wrap each Dynamo graph, and outputs are cloned out of graph memory (callers may keep them across calls).
    `vgc.trace_once.TraceOnceBackend`, the backend of `vgc.compile`, changes those choices by overriding the
    methods that make them.
    """

    capture_on_demand = True   # piece graphs capture the second time a capture size runs

    def __init__(self, config: CompilationConfig | None = None):
        self.config = config if config is not None else CompilationConfig()
        self.graphs: list[GraphRecord] = []
        self.counters = Counters.child_of(counters)   # this model's work; vgc.counters stays the process total
        # Built up front, used only by graphs on CUDA with a piece-graph mode (the device is known per graph).
        self.graph_runtime = GraphRuntime(self.config.resolved_capture_sizes(), debug=self.config.debug,
                                          capture_on_demand=self.capture_on_demand, counters=self.counters)
        self._memo: dict[str, Callable] = {}   # artifact name -> compiled callable, shared by identical pieces
        self._seen_keys: set[str] = set()
        self._told_unsplit = False   # the "no splitting op occurs" advice is given once per model
        self._configs: tuple[dict, dict] | None = None   # Inductor options, with the pass manager

    def __call__(self, gm: fx.GraphModule, example_inputs: list, options: dict | None = None,
                 mode: str | None = None) -> Callable:
        try:
            if options or mode:
                raise ValueError("pass options through CompilationConfig when using a VgcBackend instance "
                                 "(torch.compile(..., options=...) is for backend='vgc')")
            return self._compile_graph(gm, example_inputs)
        except ValueError as e:
            raise _compat.through_dynamo(e) from e

    def _compile_graph(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        plan = self._plan_graph(gm, example_inputs)
        start = time.perf_counter()
        store = open_store(self.config, plan.device_type, traced_source_files(_compat.traced_code_objects()))
        plan.seconds["cache_key"] = time.perf_counter() - start
        graph_runtime = self._piece_graph_runtime(plan.device_type)
        forward = self.build(plan, store, around=self._full_graphs(gm, example_inputs, plan.device_type,
                                                                   graph_runtime))
        debug_files.expect_transformed_code(store)
        forward = self._about_to_run(forward, plan, graph_runtime)
        anchor = _grad_anchor(example_inputs)
        # Only graphs compiled with autograd on pay for the wrapper; vgc.compile always traces without it.
        return forward if anchor is None else _raise_on_backward(forward, gm, anchor)

    def _about_to_run(self, forward: Callable, plan: GraphPlan, graph_runtime: GraphRuntime | None) -> Callable:
        """The built forward as Dynamo will run it: drop-in callers may keep outputs across calls, so none is
        memory the next graph replay overwrites."""
        return forward if graph_runtime is None else _copy_graph_outputs(forward, graph_runtime)

    def _plan_graph(self, gm: fx.GraphModule, example_inputs: list) -> GraphPlan:
        """Split Dynamo's graph and describe each piece: its structural key, sizes, and what CUDA graphs need."""
        splitting_ops = self.config.splitting_ops
        if tuple(splitting_ops) == DEFAULT_SPLITTING_OPS and sdpa_reads_a_kv_cache(gm):
            # A Hugging Face decode step on its own KV cache: split at its SDPA, so that the cache update and the
            # mask run with attention and the compiled pieces keep the tokens' shape (graphs on every step).
            splitting_ops = [*splitting_ops, SDPA]
        check_splitting_ops(splitting_ops, gm)
        start = time.perf_counter()
        # An id outside an embedding table aborts the compiled CPU kernel, and on CUDA a device assert leaves the
        # context unusable (eager raises IndexError): checked on each call, and clamped in the graph, since a FULL
        # graph replays before its check ends.
        input_check = request_checks.checker_for(gm, example_inputs, bound=True)
        split_gm, pieces = split_graph(gm, splitting_ops)
        piece_inputs = _piece_example_inputs(split_gm, example_inputs)
        module_state = _module_state_arguments(split_gm, example_inputs)
        if self.config.pass_config.get("fuse_sibling_matmuls") and fuse_sibling_linears(
                split_gm, pieces, piece_inputs, module_state, _compat.detect_fake_mode(example_inputs)):
            piece_inputs = _piece_example_inputs(split_gm, example_inputs)
            module_state = _module_state_arguments(split_gm, example_inputs)
        mutated = {p.name: frozenset(mutated_inputs(p.module)) for p in pieces if not p.is_splitting}
        lay_out_eager_results(split_gm, pieces, piece_inputs, mutated)
        if self.config.splitting_ops and not any(piece.is_splitting for piece in pieces):
            self._explain_unsplit(gm)
        inductor_config, static_config = self._inductor_configs()
        extra = repr((sorted(inductor_config.items()), sorted(static_config.items())))
        shape_guards = snapshot_shape_guards(_compat.detect_fake_mode(example_inputs))

        def facts(inputs) -> list[str]:
            # What the trace knew of a piece's sizes when Inductor compiled it (`s0 >= 8`): Inductor may rely on it
            # without a guard of its own, so a piece of another trace (a compile range, a Dynamo recompile) that
            # knows otherwise must not load this artifact.
            symbols = free_symbols(inputs)
            return sorted(str(expr) for expr, _, _ in shape_guards if expr.free_symbols & symbols)

        plans = []
        for piece in pieces:
            if piece.is_splitting:   # keyed too: a saved trace stores identical eager pieces once
                key = piece_key(piece.module, list(piece_inputs[piece.name])) if piece.name in piece_inputs else ""
                plans.append(PiecePlan(piece.name, splitting=True, key=key, module=piece.module))
            elif piece.name in piece_inputs:   # else a dead piece (never called)
                inputs = list(piece_inputs[piece.name])
                size_source = find_size_source(inputs)
                if size_source is None and self.config.compile_sizes:
                    logger.debug("%s has no single symbolic size; compile_sizes do not apply to it", piece.name)
                plans.append(PiecePlan(
                    piece.name, splitting=False,
                    key=piece_key(piece.module, inputs, extra=repr((extra, facts(inputs)))),
                    sizes=tuple(self.config.compile_sizes) if size_source is not None else (),
                    size_source=size_source, has_symbols=bool(free_symbols(inputs)),
                    single=not _compat.graph_returns_tuple(piece.module),
                    module_state=tuple(module_state[piece.name]), mutated=mutated[piece.name],
                    module=piece.module, example_inputs=inputs))
        state = []
        for node, value in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs):
            source = _compat.placeholder_source_name(node)
            if isinstance(value, torch.Tensor) and source.startswith("L['self']") and \
                    all(isinstance(d, int) for d in value.shape):
                state.append(StateTensor(source, value.dtype, tuple(value.shape), str(value.device),
                                         tuple(value.stride())))
        return GraphPlan(split_gm, pieces, plans, _compat.device_from_inputs(example_inputs).type,
                         shape_guards, input_check=input_check, example_inputs=example_inputs,
                         seconds={"split": time.perf_counter() - start}, state_tensors=state,
                         code_files=_compat.graph_code_files(gm), collectives=collective_calls(gm))

    def _full_graphs(self, gm: fx.GraphModule, example_inputs: list, device_type: str,
                     graph_runtime: GraphRuntime | None) -> Callable | None:
        """Drop-in FULL graphs: what wraps the split graph's forward in a `DropInGraphs`, or None (no FULL graphs:
        another mode, or no CUDA)."""
        mode = self.config.resolved_cudagraph_mode(device_type)
        if graph_runtime is None or not mode.has_full:
            return None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        state = [is_model_state(node, value) for node, value in zip(placeholders, example_inputs)]
        inputs = GraphInputs.of(example_inputs, state, mutated_inputs(gm),
                                [_compat.placeholder_source_name(node) or node.name for node in placeholders])
        compile_id = _compat.dynamo_compile_id()   # each drop-in graph has a backend of its own: name it as torch does
        label = f"Dynamo graph {compile_id}" if compile_id else f"graph {len(self.graphs)}"
        blocker = full_graph_blocker(gm)
        return lambda forward: DropInGraphs(forward, inputs, mode, graph_runtime, label=label, blocker=blocker)

    def build(self, plan: GraphPlan, store, around: Callable | None = None) -> Callable:
        """Compile or load every piece of `plan` and assemble the forward. A plan rebuilt from a saved trace only
        loads; an artifact it cannot load raises `MissingArtifact`. `around(forward)` wraps the assembled forward
        inside the token-id check (drop-in FULL graphs replay without calling it)."""
        record = GraphRecord(pieces=plan.pieces, compiled={}, unique_keys=set(), cache_dir=None,
                             computation_graph=None, counters=Counters.child_of(self.counters),
                             device_type=plan.device_type, shape_guards=plan.shape_guards,
                             input_check=plan.input_check, seconds=dict(plan.seconds),
                             collectives=plan.collectives)
        record.counters.add(dynamo_traces=int(plan.traced))
        graph_runtime = self._piece_graph_runtime(plan.device_type)
        split_gm = plan.split_gm
        start = time.perf_counter()
        artifacts = sum(1 + len(p.sizes) for p in plan.plans if not p.splitting)
        # Inference artifacts whatever the caller's grad mode: with autograd on, AOTAutograd would build a training
        # graph that saves activations, and the memo and cache (whose keys ignore grad mode) would hand it to
        # no_grad calls too.
        with log.progress(artifacts, f"vgc: graph {len(self.graphs)}", unit="artifact") as progress, torch.no_grad():
            for piece in plan.plans:
                if piece.splitting:
                    _call_custom_ops_directly(piece.module)
                    # Bound forward skips nn.Module.__call__: attention pieces run eagerly with no hook overhead.
                    split_gm.__dict__[piece.name] = _compat.generated_forward(piece.module)
                    continue
                compiled = self._compile_piece(piece, store, record.counters, progress)
                record.compiled[piece.name] = compiled
                record.unique_keys.add(compiled.key)
                split_gm.__dict__[piece.name] = compiled if graph_runtime is None else \
                    CUDAGraphPiece(compiled, list(piece.module_state), piece.mutated, graph_runtime)
        record.seconds["compile"] = time.perf_counter() - start
        record.counters.add(pieces=len(plan.pieces), splitting_pieces=sum(p.is_splitting for p in plan.pieces))
        if plan.compiler_guards is None:
            plan.compiler_guards = self._compiler_guards(plan)
        record.compiler_guards = plan.compiler_guards

        record.cache_dir = str(store.directory) if store.directory is not None else None
        if plan.traced or store.directory is None:
            record.computation_graph = debug_files.write_computation_graph(store, split_gm, record.pieces)
        else:   # written when the trace was saved, beside it
            record.computation_graph = debug_files.existing_computation_graph(store, len(self.graphs))
        self.graphs.append(record)
        logger.info("graph %d: %d pieces (%d unique compiled), %d compiled, %d loaded in %.2f s%s",
                    len(self.graphs) - 1, len(record.pieces), len(record.unique_keys),
                    record.counters.inductor_compiles, record.counters.artifacts_loaded, record.seconds["compile"],
                    f"; cache {record.cache_dir}" if record.cache_dir else "")
        # The generated forward frees each intermediate after its last use (FX codegen), with no Module call.
        forward = split_gm.forward
        # Attention calls share one host read of the lengths per call (`vgc.ops.attention.lengths_read_once`)
        if not any(p.mutated for p in plan.plans if not p.splitting):
            forward = lengths_read_once(forward)
        if around is not None:
            forward = record.full_graphs = around(forward)
        if record.input_check is not None:
            forward = request_checks.checked(forward, record.input_check)
        return forward

    def _compiler_guards(self, plan: GraphPlan) -> list:
        """Size assumptions Inductor added on top of Dynamo's guards: none to record, Dynamo's guards stay."""
        return []

    def _explain_unsplit(self, gm: fx.GraphModule) -> None:
        """Say why the graph runs as one piece: none of the splitting ops occurs. A user's SDPA model or a
        Hugging Face model calls aten's attention, not the default `vgc::attention`."""
        found = attention_like_ops(gm)
        if not found:
            written_out = eager_attention_count(gm)
            if written_out and not self._told_unsplit:
                # No op to split at: with a KV cache the one piece follows the KV length, and gets no graph.
                self._told_unsplit = True
                logger.warning("the graph computes attention in plain ops (softmax of q @ k, x%d), where no "
                               "splitting op can split it, so it compiles as one piece. For a transformers "
                               "model: load it with attn_implementation='sdpa' if its family offers that (vgc "
                               "splits at SDPA where it reads a KV cache), or try "
                               "vgc.integrations.transformers.compile(model), which checks the model's attention "
                               "before serving it and says why when it cannot; for your own model call "
                               "F.scaled_dot_product_attention or a torch.library op and pass it in splitting_ops",
                               written_out)
                return
            logger.debug("no splitting op of %s occurs in the graph, nor any attention-like op; it compiles "
                         "as one piece", self.config.splitting_ops)   # an MLP: one piece is right
            return
        if self._told_unsplit:
            return
        self._told_unsplit = True
        logger.info("no splitting op of %s occurs in the graph; it has %s: pass splitting_ops=%s to split there",
                    self.config.splitting_ops, ", ".join(f"{name} (x{count})" for name, count in found.items()),
                    list(found))

    def _compile_piece(self, piece: PiecePlan, store, graph_counters: Counters, progress) -> CompiledPiece:
        inductor_config, static_config = self._inductor_configs()
        if piece.key not in self._seen_keys:
            self._seen_keys.add(piece.key)
            graph_counters.add(unique_pieces=1)
        if self.config.piece_backend == PieceBackend.EAGER:
            return self._eager_piece(piece, progress)

        def build(size: int | None) -> Callable:
            name = piece.artifact_name(size)
            progress.set_postfix_str(f"{piece.name}, {'symbolic size' if size is None else f'size {size}'}",
                                     refresh=False)
            fn = self._memo.get(name)
            if fn is None:
                if piece.module is None or piece.example_inputs is None:   # from a saved trace: load only
                    fetched = store.load(name)
                    if fetched is None or fetched.artifact is None:
                        raise MissingArtifact(f"the saved trace needs artifact {name}, which "
                                              f"{'is damaged' if fetched else 'is not'} in {store.directory}")
                    fetched = Fetched(fetched.artifact, {**fetched.counts, "cache_hits": 1})
                else:
                    fetched = store.load_or_compile(
                        name,
                        lambda: compile_piece(piece.module, piece.example_inputs, size=size,
                                              size_source=piece.size_source,
                                              inductor_config=inductor_config if size is None else static_config),
                        meta={"piece": piece.name, "size": size})
                graph_counters.add(**fetched.counts)
                fn = unwrap_single(fetched.artifact) if piece.single else fetched.artifact
                self._memo[name] = fn
            progress.update()
            return fn

        dynamic_fn = build(None)
        static_fns = {size: build(size) for size in piece.sizes}
        return CompiledPiece(piece.name, piece.key, dynamic_fn, static_fns, piece.size_source,
                             has_symbols=piece.has_symbols)

    def _eager_piece(self, piece: PiecePlan, progress) -> CompiledPiece:
        """`piece_backend="eager"`: the piece's own graph runs, one callable for every size. Not shared between
        identical pieces: each graph reads its own constants. A saved trace stores these graphs with the split."""
        if piece.module is None:
            raise MissingArtifact(f"the saved trace holds no graph for eager piece {piece.name}")
        _call_custom_ops_directly(piece.module)
        progress.update(1 + len(piece.sizes))
        return CompiledPiece(piece.name, piece.key, _compat.generated_forward(piece.module), {}, piece.size_source,
                             has_symbols=piece.has_symbols)

    def _inductor_configs(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Inductor's options for the symbolic-size artifacts and for the `compile_sizes` ones, with the graph
        passes (vgc's and the user's) in the post-grad pass slot."""
        if self._configs is None:
            base = self.config.inductor_compile_config
            manager = pass_manager(self.config.pass_config, self.config.inductor_passes)
            if manager is not None:
                base = {**base, "post_grad_custom_post_pass": manager}
            self._configs = (base, {**base, **self.config.compile_sizes_inductor_config})
        return self._configs

    def _piece_graph_runtime(self, device_type: str) -> GraphRuntime | None:
        """The runtime when this graph's compiled pieces get CUDA graphs, else None."""
        mode = self.config.resolved_cudagraph_mode(device_type)
        if mode == CUDAGraphMode.NONE:
            return None
        if device_type != "cuda":
            # once per process: the drop-in builds a backend per graph Dynamo hands it (a graph break makes two)
            log.warn_once(f"graphs on {device_type}:{mode.value}", "cudagraph_mode=%s needs a CUDA device; this "
                          "%s model runs without CUDA graphs", mode.value, device_type)
            return None
        # Drop-in FULL keeps piece graphs for the signatures a FULL graph cannot hold.
        return self.graph_runtime

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


# torch.compile's modes in vgc's terms (torch refuses a mode together with options). transformers'
# `CompileConfig(backend="vgc")` passes mode="reduce-overhead" unless told otherwise.
COMPILE_MODES = {
    "default": {},
    "reduce-overhead": {"cudagraph_mode": "full_and_piecewise"},
    "max-autotune": {"cudagraph_mode": "full_and_piecewise", "inductor_compile_config": {"max_autotune": True}},
    "max-autotune-no-cudagraphs": {"inductor_compile_config": {"max_autotune": True}},
}


def vgc_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None,
                mode: str | None = None) -> Callable:
    """The backend registered as "vgc": `torch.compile(model, backend="vgc", options={...})`, or with one of
    torch.compile's modes (`COMPILE_MODES`)."""
    try:
        if mode is not None:
            if mode not in COMPILE_MODES:
                raise ValueError(f"backend='vgc' takes mode None or one of {sorted(COMPILE_MODES)}, got {mode!r}; "
                                 "or pass CompilationConfig fields through options=..., e.g. "
                                 "options={'compile_sizes': [1, 8]}")
            options = COMPILE_MODES[mode]
        config = CompilationConfig.from_options(options)
    except ValueError as e:
        raise _compat.through_dynamo(e) from e
    return VgcBackend(config)(gm, example_inputs)
