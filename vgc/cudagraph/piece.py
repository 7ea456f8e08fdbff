"""PIECEWISE CUDA graphs: one graph per (compiled piece, capture size), attention runs eagerly in between."""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from vgc import _compat, views
from vgc.counters import counters
from vgc.cudagraph import runtime as cuda_runtime  # module attribute access: tests substitute capture()
from vgc.cudagraph.runtime import GraphRuntime, capture_failure, piece_graphs_bypassed
from vgc.piecewise import CompiledPiece

logger = logging.getLogger("vgc")


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: list                      # what the graph reads: vgc-owned copies where the caller's may move
    copy_in: list[int]                # argument positions copied into `inputs` before each replay
    pinned: list[tuple[int, int]]     # (argument position, address) the graph reads in place
    outputs: object                   # the graph's output tensors, rewritten by every replay


# Python's in-place operators as Dynamo records them (`x += y` is operator.iadd, `x[i] = y` operator.setitem):
# each writes its first argument when that is a tensor.
_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                       operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                       operator.irshift, operator.imatmul, operator.setitem}


def mutated_inputs(gm: fx.GraphModule) -> set[int]:
    """Positions of the piece's inputs that it writes in place (directly or through a view)."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}

    def base_input(node):
        # Any result that may share its argument's storage counts: an in-place op on it may write the base.
        node = views.storage_base(node)
        return placeholders.get(node) if isinstance(node, fx.Node) else None

    mutated = set()
    for node in gm.graph.nodes:
        mutated.update(i for i in map(base_input, written_arguments(node)) if i is not None)
    return mutated


def written_arguments(node: fx.Node) -> list:
    """The arguments `node` writes in place (by its schema, as Python's in-place operators, or as `x.op_()`)."""
    if node.op not in ("call_function", "call_method"):
        return []
    schemas = _compat.op_schemas(node.target)
    if schemas:   # several for a packet: an argument any of its overloads writes counts
        return [_argument(node, arg, i) for schema in schemas for i, arg in enumerate(schema.arguments)
                if arg.alias_info is not None and arg.alias_info.is_write]
    if node.target in _IN_PLACE_OPERATORS or getattr(operator, _name(node).strip("_"), None) in \
            _IN_PLACE_OPERATORS:   # also `x.__iadd__(y)`
        return list(node.args[:1])
    if _name(node).endswith("_") and not _name(node).startswith("__") and node.args:
        return [node.args[0]]
    return []


def _argument(node: fx.Node, argument: torch.Argument, position: int):
    """The value `node` passes for a schema argument, positionally or by keyword (None when not passed)."""
    if position < len(node.args) and not argument.kwarg_only:
        return node.args[position]
    return node.kwargs.get(argument.name)


def _name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


class CUDAGraphPiece:
    """Replays a captured graph for sizes in the capture list; runs the compiled piece for other sizes."""

    def __init__(self, piece: CompiledPiece, module_state: list[bool], mutated: set[int], runtime: GraphRuntime):
        self.piece = piece
        self.name = piece.name
        self.module_state = module_state   # per argument: a weight or buffer of the model (address never moves)
        self.mutated = mutated             # arguments the piece writes: a copy would lose the write
        self.runtime = runtime
        self.entries: dict[int | None, _Entry] = {}
        self.seen_sizes: set[int | None] = set()
        self.failed_sizes: set[int | None] = set()   # sizes whose capture failed: they run un-graphed
        self._warned_moved = False
        runtime.pieces.append(self)

    def __call__(self, *args):
        if piece_graphs_bypassed():
            return self.piece(*args)
        size = self.piece.runtime_size(args)
        entry = self.entries.get(size)
        if entry is not None:
            return self._replay(entry, args)
        # size None: either fully static inputs (one graph serves every call) or several independent dynamic
        # sizes, which no single capture size describes: those pieces always run un-graphed.
        capturable = size in self.runtime.capture_sizes if size is not None else not self.piece.has_symbols
        if capturable and self.runtime.capture_allowed and size in self.seen_sizes and size not in self.failed_sizes:
            return self._capture(size, args)
        self.seen_sizes.add(size)   # the first run at a size is the warm-up (lazy kernel loading, autotuning)
        return self.piece(*args)

    def _replay(self, entry: _Entry, args):
        for i, address in entry.pinned:
            if args[i].data_ptr() != address:
                # The graph would read (or write) the old buffer: run this call without it.
                if not self._warned_moved:
                    self._warned_moved = True
                    logger.warning("input %d of %s is not at the address its CUDA graph was captured "
                                   "with; such calls run without the graph", i, self.name)
                counters.eager_runs += 1
                return self.piece(*args)
        for i in entry.copy_in:
            entry.inputs[i].copy_(args[i])
        entry.graph.replay()
        counters.cudagraph_replays += 1
        return entry.outputs

    def _capture(self, size: int | None, args) -> object:
        inputs, copy_in, pinned = [], [], []
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor) or self.module_state[i]:
                inputs.append(arg)
            elif self.runtime.is_stable(arg) or i in self.mutated:
                inputs.append(arg)
                pinned.append((i, arg.data_ptr()))
            else:
                inputs.append(arg.clone())
                copy_in.append(i)
        try:
            graph, outputs = cuda_runtime.capture(lambda: self.piece(*inputs), self.runtime.pool())
        except Exception as error:   # noqa: BLE001 - a piece that cannot be captured runs without a graph
            if not self.failed_sizes:
                logger.warning("CUDA graph capture of %s failed (%s); it runs without a graph at that size",
                               self.name, capture_failure(error))
            self.failed_sizes.add(size)
            return self.piece(*args)
        graph.replay()   # capturing only records: this call's results come from the first replay
        self.entries[size] = _Entry(graph, inputs, copy_in, pinned, outputs)
        self.runtime.mark_stable(outputs if isinstance(outputs, (list, tuple)) else [outputs])
        self.runtime.counters.add(cudagraph_captures=1)
        logger.debug("captured %s at size %s (%d inputs copied in, %d read in place)", self.name, size,
                     len(copy_in), len(pinned))
        return outputs
