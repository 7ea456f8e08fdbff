"""PIECEWISE CUDA graphs: one graph per (compiled piece, capture size), attention runs eagerly in between."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vgc import cuda_runtime  # module attribute access: tests substitute capture()
from vgc.counters import counters
from vgc.cudagraph.runtime import capture_failure, GraphRuntime, piece_graphs_bypassed
from vgc.piecewise.compiled_piece import CompiledPiece

logger = logging.getLogger("vgc")


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: list                      # what the graph reads: vgc-owned copies where the caller's may move
    copy_in: list[int]                # argument positions copied into `inputs` before each replay
    pinned: list[tuple[int, int]]     # (argument position, address) the graph reads in place
    outputs: object                   # the graph's output tensors, rewritten by every replay


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
