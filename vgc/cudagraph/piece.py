"""PIECEWISE CUDA graphs: one graph per (compiled piece, capture size), attention runs eagerly in between."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vgc.counters import counters
from vgc.cudagraph.runtime import GraphRuntime, piece_graphs_bypassed
from vgc.piecewise import CompiledPiece

logger = logging.getLogger("vgc")


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: list            # the tensors the graph reads (vgc-owned copies where the caller's were not stable)
    copy_in: list[int]      # argument positions copied into `inputs` before each replay
    outputs: object         # the graph's output tensors, rewritten by every replay


class CUDAGraphPiece:
    """Replays a captured graph for sizes in the capture list; runs the compiled piece for other sizes."""

    def __init__(self, piece: CompiledPiece, module_state: list[bool], runtime: GraphRuntime):
        self.piece = piece
        self.name = piece.name
        self.module_state = module_state   # per argument: a weight or buffer of the model (address never moves)
        self.runtime = runtime
        self.entries: dict[int | None, _Entry] = {}
        self.seen_sizes: set[int | None] = set()
        runtime.pieces.append(self)

    def __call__(self, *args):
        if piece_graphs_bypassed():
            return self.piece(*args)
        size = self.piece.runtime_size(args)
        entry = self.entries.get(size)
        if entry is not None:
            for i in entry.copy_in:
                if args[i].data_ptr() != entry.inputs[i].data_ptr():
                    entry.inputs[i].copy_(args[i])
            if self.runtime.debug:
                self._check_addresses(entry, args)
            entry.graph.replay()
            counters.cudagraph_replays += 1
            return entry.outputs
        # size None: either fully static inputs (one graph serves every call) or several independent dynamic
        # sizes, which no single capture size describes: those pieces always run un-graphed.
        capturable = size in self.runtime.capture_sizes if size is not None else not self.piece.has_symbols
        if capturable and self.runtime.capture_allowed and size in self.seen_sizes:
            return self._capture(size, args)
        self.seen_sizes.add(size)   # the first run at a size is the warm-up (lazy kernel loading, autotuning)
        return self.piece(*args)

    def _capture(self, size: int | None, args) -> object:
        inputs, copy_in = [], []
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and not (self.module_state[i] or self.runtime.is_stable(arg)):
                inputs.append(arg.clone())
                copy_in.append(i)
            else:
                inputs.append(arg)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.runtime.pool()):
            outputs = self.piece(*inputs)
        graph.replay()   # capturing only records: this call's results come from the first replay
        self.entries[size] = _Entry(graph, inputs, copy_in, outputs)
        self.runtime.mark_stable(outputs if isinstance(outputs, (list, tuple)) else [outputs])
        counters.cudagraph_captures += 1
        logger.debug("vgc: captured %s at size %d (%d inputs copied in per replay)", self.name, size, len(copy_in))
        return outputs

    def _check_addresses(self, entry: _Entry, args) -> None:
        for i, (arg, captured) in enumerate(zip(args, entry.inputs)):
            if isinstance(arg, torch.Tensor) and i not in entry.copy_in and arg.data_ptr() != captured.data_ptr():
                raise RuntimeError(f"vgc debug: input {i} of {self.name} moved from {captured.data_ptr():#x} to "
                                   f"{arg.data_ptr():#x} since capture; the graph would read a stale buffer")

