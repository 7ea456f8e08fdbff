"""PIECEWISE CUDA graphs: one graph per (compiled piece, capture size), attention runs eagerly in between."""

from __future__ import annotations

import logging

import torch

from vgc.counters import counters
from vgc.cudagraph.captured import capture_graph, CapturedGraph, positions
from vgc.cudagraph.runtime import capture_failure, GraphRuntime, piece_graphs_bypassed
from vgc.piecewise.compiled_piece import CompiledPiece

logger = logging.getLogger("vgc")


class CUDAGraphPiece:
    """Replays a captured graph for sizes in the capture list; runs the compiled piece for other sizes."""

    def __init__(self, piece: CompiledPiece, module_state: list[bool], mutated: set[int], runtime: GraphRuntime):
        self.piece = piece
        self.name = piece.name
        self.module_state = module_state   # per argument: a weight or buffer of the model (address never moves)
        self.mutated = mutated             # arguments the piece writes: a copy would lose the write
        self.runtime = runtime
        self.entries: dict[int | None, CapturedGraph] = {}
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

    def _replay(self, entry: CapturedGraph, args):
        moved = entry.moved(args)
        if moved is not None:
            # The graph would read (or write) the old buffer: run this call without it.
            if not self._warned_moved:
                self._warned_moved = True
                logger.warning("input %d of %s is not at the address its CUDA graph was captured with; such "
                               "calls run without the graph", entry.pinned_at[moved], self.name)
            counters.eager_runs += 1
            return self.piece(*args)
        entry.replay(args)
        counters.cudagraph_replays += 1
        return entry.outputs

    def _capture(self, size: int | None, args) -> object:
        inputs, copy_in, pinned = list(args), [], []
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor) or self.module_state[i]:
                continue
            if self.runtime.is_stable(arg) or i in self.mutated:
                pinned.append(i)
            else:
                inputs[i] = arg.clone()
                copy_in.append(i)
        try:
            entry = capture_graph(lambda: self.piece(*inputs), self.runtime.pool(), held=inputs, args=args,
                                  pinned_at=pinned, pinned_of=positions(pinned),
                                  copy_targets=[inputs[i] for i in copy_in], copy_of=positions(copy_in))
        except Exception as error:   # noqa: BLE001 - a piece that cannot be captured runs without a graph
            if not self.failed_sizes:
                logger.warning("CUDA graph capture of %s failed (%s); it runs without a graph at that size",
                               self.name, capture_failure(error))
            self.failed_sizes.add(size)
            return self.piece(*args)
        self.entries[size] = entry
        outputs = entry.outputs
        self.runtime.mark_stable(outputs if isinstance(outputs, (list, tuple)) else [outputs])
        self.runtime.counters.add(cudagraph_captures=1)
        logger.debug("captured %s at size %s (%d inputs copied in, %d read in place)", self.name, size,
                     len(copy_in), len(pinned))
        return outputs
