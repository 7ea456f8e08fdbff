"""Per-call choice between a FULL graph, PIECEWISE graphs and no graph, with padding to capture sizes.

Used by `vgc.compile`: inputs are padded into vgc-owned buffers, so every graph reads fixed addresses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vgc import cuda_runtime  # module attribute access: tests substitute capture()
from vgc.capture.paths import argument_tensors, InputMismatchError, reader, render_path
from vgc.config import CUDAGraphMode
from vgc.counters import counters
from vgc.cudagraph.captured import capture_graph, CaptureLoop, CapturedGraph, largest_first
from vgc.cudagraph.memory import GraphMemory
from vgc.cudagraph.padding import batch_dims, output_tensors, padded_size, slice_outputs, StaticInputs
from vgc.cudagraph.runtime import bypass_piece_graphs, check_replay, GraphRuntime, ReplaySampler

logger = logging.getLogger("vgc")


@dataclass
class GraphStats:
    capture_seconds: float = 0.0
    pool_bytes_after_each: list[int] = field(default_factory=list)
    memory: GraphMemory = field(default_factory=GraphMemory)


class GraphDispatcher:
    """The CUDA graphs of one `vgc.compile` model, built right after its trace.

    `call` runs the compiled model on bound arguments; `dynamic` maps each padded argument to its dynamic dim
    (the first one is the batch size); the traced call's arguments and output tell which output dims follow
    the batch size.
    """

    def __init__(self, call: Callable[[dict], Any], mode: CUDAGraphMode, capture_sizes: list[int],
                 dynamic: dict[str, int], pad_values: dict | None, uniform_decode: Callable[[dict], bool] | None,
                 runtime: GraphRuntime, traced_arguments: dict, traced_output: Any,
                 id_check=None, query_len: int = 1):
        self.call = call
        # token ids: a FULL replay skips the compiled forward, and its check with it (`ArgumentIdCheck`)
        self.id_check = id_check
        self.mode = mode
        self.capture_sizes = sorted(capture_sizes)
        self.dynamic = dynamic
        self.size_arg = next(iter(dynamic))
        self.static = StaticInputs(self.capture_sizes[-1], pad_values)
        self.may_pad = pad_values is not None   # without pad values only exact capture sizes replay graphs
        self.uniform_decode = uniform_decode
        self.runtime = runtime
        self.full: dict[int, CapturedGraph] = {}
        self.full_sizes: list[int] = []   # sorted keys of `full`
        # tokens per sequence of a uniform decode batch; above 1 (speculative decoding), a FULL graph is captured
        # at each capture size that is a multiple of it, and a call pads each input to that graph's extents
        self.query_len = query_len
        self.stats = GraphStats()
        self._debug = ReplaySampler()
        # (output shapes, batch size) of the traced call, to learn which output dims follow the batch size.
        self.trace_outputs = ([t.shape for t in output_tensors(traced_output)], self.batch_size(traced_arguments))
        self.output_dims: list[tuple[int, ...]] | None = None
        self.use_full = mode.has_full
        self.use_piecewise = mode.has_piecewise

    def restricted(self, sizes: list[int]) -> "GraphDispatcher | None":
        """This dispatcher keeping only `sizes` of its capture sizes (its compile range's), before capture; None
        when none is left (the range runs without graphs)."""
        wanted = set(sizes)
        sizes = [s for s in self.capture_sizes if s in wanted]   # capture_sizes is sorted
        if not sizes:
            return None
        self.capture_sizes, self.static = sizes, StaticInputs(sizes[-1], self.static.pad_values)
        return self

    # ---- per call ----
    def batch_size(self, arguments: dict) -> int:
        return arguments[self.size_arg].shape[self.dynamic[self.size_arg]]

    def run(self, arguments: dict):
        size = self.batch_size(arguments)
        if self.query_len > 1 and self.use_full and self.may_pad and (
                self.uniform_decode is None or self.uniform_decode(arguments)):
            out = self._run_full_per_input(arguments, size)
            if out is not None:
                return out
        padded = padded_size(size, self.capture_sizes)
        if padded != size and not self.may_pad:
            padded = None
        if padded is None or not self.static.all_fit(arguments, self.dynamic, padded, size):
            return self._ungraphed(arguments)
        padded_arguments = self._pad(arguments, padded, size)
        full = None
        if self.use_full and (self.uniform_decode is None or self.uniform_decode(arguments)):
            full = self.full.get(padded)
            if full is not None and any(padded_arguments[name].shape != shape for name, shape in full.shapes.items()):
                full = None   # another dynamic input relates to the batch size differently than at capture
        if full is not None:
            self._check_pinned(full, padded_arguments)
            out = self._replay_checked(full, arguments)
        elif self.use_piecewise:
            out = self.call(padded_arguments)
        else:
            return self._ungraphed(arguments)
        out = self._slice(out, size)
        if self.runtime.debug and self._debug.due(padded):
            check_replay(out, lambda: self.call(arguments), f"padded size {padded}")
        return out

    def _run_full_per_input(self, arguments: dict, size: int):
        """A uniform decode call of several tokens per sequence on the smallest FULL graph that holds it, each
        input padded to the extent the graph was captured with (sequence inputs grow by fewer entries than token
        inputs); None when no FULL graph holds it."""
        full = self.full.get(padded_size(size, self.full_sizes))
        if full is None:
            return None
        extents = {name: full.shapes[name][dim] for name, dim in self.dynamic.items()}
        padded = self.static.pad_to(arguments, self.dynamic, extents)
        if padded is None:
            return None
        self._check_pinned(full, arguments)   # the pinned ones (KV caches) are not padded
        out = self._slice(self._replay_checked(full, arguments), size)
        if self.runtime.debug and self._debug.due(("full", extents[self.size_arg])):
            check_replay(out, lambda: self.call(arguments), f"FULL graph of {extents[self.size_arg]} tokens")
        return out

    def _replay_checked(self, full: CapturedGraph, arguments: dict):
        """`full` replayed for a call, its token ids travelling to the host meanwhile: the graph's lookups clamp
        them, and a refused call raises here, its output never returned."""
        end_check = self.id_check.begin(arguments) if self.id_check is not None else None
        out = full.replay()
        counters.cudagraph_replays += 1
        if end_check is not None:
            end_check()
        return out

    # ---- for callers that own the inputs ----
    def full_graph_inputs(self, size: int) -> dict[str, torch.Tensor] | None:
        """The buffers the FULL graph of capture size `size` reads its dynamic arguments from, or None when no
        FULL graph has that size. A caller that builds every input itself (an engine over its own KV cache)
        writes them there, pad entries included, and calls `replay_full(size)`: no binding, no contract check,
        no padding copy, no address check. What `run` checks is then the caller's to keep true: the same
        non-dynamic tensors (KV caches) as at capture, inputs of the traced dtypes, inert pad entries."""
        full = self.full.get(size)
        return None if full is None else {name: full.held[name] for name in self.dynamic}

    def full_graph_output(self, size: int):
        """What the FULL graph of capture size `size` writes (padded, in graph memory), without replaying it: a
        caller that chains its own graph after it reads it there."""
        return self.full[size].outputs

    def replay_full(self, size: int):
        """Replay the FULL graph of `size` on what its input buffers hold; returns its output, padded and in
        graph memory (the next replay overwrites it). Debug mode re-runs the model on those same buffers, so it
        catches a graph that reads memory other than its buffers, not a caller that left a buffer unwritten
        (`run` re-runs on the caller's own tensors and catches both)."""
        full = self.full[size]
        out = full.replay()
        counters.cudagraph_replays += 1
        if self.runtime.debug and self._debug.due(size):
            check_replay(out, lambda: self.call(full.held), f"padded size {size}")
        return out

    def _ungraphed(self, arguments: dict):
        counters.eager_runs += 1
        with bypass_piece_graphs():   # piece graphs would read the padded buffers, not these inputs
            return self.call(arguments)

    def _slice(self, out, size: int):
        if self.output_dims is None:
            return slice_outputs(out, size)
        return slice_outputs(out, size, iter(self.output_dims))

    def learn_output_dims(self, out, size: int) -> None:
        """Which dims of each output follow the batch size: those equal to it now and at trace time."""
        if self.output_dims is not None:
            return
        trace_shapes, trace_size = self.trace_outputs
        self.output_dims = batch_dims([t.shape for t in output_tensors(out)], size, trace_shapes, trace_size)

    def _pad(self, arguments: dict, padded: int, size: int) -> dict:
        out = dict(arguments)
        out.update(self.static.pad_all(arguments, self.dynamic, padded - size))
        return out

    def _pinned_at(self, arguments: dict) -> list[tuple[str, tuple]]:
        """Where the tensors passed through unpadded (KV caches) are: their addresses are baked in."""
        return [(name, steps) for name, value in arguments.items() if name not in self.dynamic
                for steps, _ in argument_tensors(value)]

    @staticmethod
    def _check_pinned(full: CapturedGraph, arguments: dict) -> None:
        moved = full.moved(arguments)
        if moved is not None:
            name, steps = full.pinned_at[moved]
            raise InputMismatchError(
                f"argument {name + render_path(steps)!r} is not the tensor the FULL CUDA graph was captured "
                "with (its address changed); graphs read fixed addresses, so allocate such tensors (e.g. KV "
                "caches) once and pass the same ones on every call")

    # ---- warm-up ----
    def capture_all(self, make_inputs: Callable[[int], dict], make_full_inputs: Callable[[int], dict],
                    budget_bytes: float | None = None, order: list[int] | None = None) -> None:
        """Capture every size's graphs, largest first (the later graphs reuse its blocks), then in `order` (a
        traffic profile's value order, `traffic.value_order`), else by size. With `budget_bytes`, a size whose
        graphs would grow the pool past it is skipped: its calls pad up to a larger captured size. A size whose
        capture runs out of memory is undone and skipped too; the start goes on."""
        sizes = largest_first(self.capture_sizes, order)
        largest = sizes[0]
        for maker in {make_inputs, make_full_inputs}:   # room for both kinds of batch (offsets: one more)
            example = maker(largest)
            for name, dim in self.dynamic.items():
                self.static.reserve(name, example[name], dim, largest)
        self.runtime.mark_stable(self.static.buffers.values())
        device = next(iter(self.static.buffers.values())).device
        maker = make_full_inputs if self.use_full else make_inputs
        memory = self.stats.memory = GraphMemory(budget_bytes)
        loop = CaptureLoop(memory, device, "CUDA graphs")
        with loop.running(len(sizes)), self.runtime.capturing():
            for size in sizes:
                loop.capture(size, size, lambda: self._capture_size(size, make_inputs, make_full_inputs),
                             first_estimate=lambda: self._run_peak_bytes(maker(size), size, device),
                             undo=lambda: self._undo(size))
        if memory.skipped:
            self.capture_sizes = [s for s in self.capture_sizes if s not in memory.skipped]
        self.stats.capture_seconds = loop.seconds
        self.stats.pool_bytes_after_each = loop.reserved_after
        logger.info("%s", loop.summary())

    def _run_peak_bytes(self, inputs: dict, size: int, device) -> int:
        """The peak memory a run at `size` allocates, without graphs: what a first graph keeps as its pool."""
        arguments = self._pad(inputs, size, size)

        def run():
            with bypass_piece_graphs():
                self.call(arguments)
        return cuda_runtime.peak_allocated_by(run, device)

    def _capture_size(self, size: int, make_inputs, make_full_inputs) -> bool:
        """Capture `size`'s graphs (the pieces' and the FULL one, as the mode has them); True."""
        if self.use_piecewise:
            arguments = self._pad(make_inputs(size), size, size)
            self.call(arguments)       # warm-up at this size: lazy kernel loading happens here
            self.learn_output_dims(self.call(arguments), size)   # pieces capture, then replay
        if self.use_full and size % self.query_len == 0:
            arguments = make_full_inputs(size)
            if self.uniform_decode is not None and not self.uniform_decode(arguments):
                raise ValueError("the inputs made for FULL CUDA graph capture are not uniform decode "
                                 "batches by the model's uniform_decode predicate")
            self._capture_full(size, self._pad(arguments, size, size))
        return True

    def _undo(self, size: int) -> None:
        """Forget every graph of `size` (a capture that failed part-way): its calls pad to another size."""
        self.full.pop(size, None)
        self.full_sizes = sorted(self.full)
        for piece in self.runtime.pieces:
            piece.entries.pop(size, None)
            piece.failed_sizes.add(size)

    def _capture_full(self, size: int, arguments: dict) -> None:
        with bypass_piece_graphs():
            self.call(arguments)               # warm-up with piece graphs bypassed
            pinned_at = self._pinned_at(arguments)
            full = capture_graph(lambda: self.call(arguments), self.runtime.pool(), held=arguments, args=arguments,
                                 pinned_at=pinned_at, pinned_of=reader(pinned_at),
                                 shapes={name: arguments[name].shape for name in self.dynamic})
        self.full[size] = full
        self.full_sizes = sorted(self.full)
        self.learn_output_dims(full.outputs, size)
        self.runtime.counters.add(cudagraph_captures=1)

    def report(self) -> dict:
        return {
            "mode": self.mode.value,
            "capture_sizes": self.capture_sizes,
            "piecewise_graphs": sum(len(p.entries) for p in self.runtime.pieces),
            "full_graphs": len(self.full),
            "capture_seconds": self.stats.capture_seconds,
            "pool_bytes_after_each": self.stats.pool_bytes_after_each,
            "graph_memory": self.stats.memory.report(),
        }
