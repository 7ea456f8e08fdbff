"""The CUDA-graph core that every owner of graphs builds on: one captured graph and the contract of its replays
(`CapturedGraph`, made by `capture_graph`), and the one loop that captures a model's sizes (`CaptureLoop`).

The owners differ only in where a call's tensors come from and which graphs a call replays: a compiled piece's
positional arguments (`piece`), a drop-in Dynamo graph's inputs (`dropin`), `vgc.compile`'s padded buffers
(`dispatch`), an encoder's budget buffers (`vgc.encoder`), a sampler's own state (the transformers integration).
What a captured graph is, how it replays, how its capture is paid for in memory and undone when memory runs out,
is said here once.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import time
from typing import Callable, Hashable, Iterable, TypeVar

import torch

from vgc import _compat, log
from vgc import cuda_runtime  # module attribute access: tests substitute capture() and the memory queries
from vgc.cudagraph.memory import GraphMemory
from vgc.cudagraph.runtime import capture_failure, frozen_gc, paused_gc

logger = logging.getLogger("vgc")

T = TypeVar("T")
data_ptr = torch.Tensor.data_ptr


def _nothing(args) -> tuple:
    return ()


class CapturedGraph:
    """A captured graph and what its replays rely on; an owner's call is `args` (whatever form it has).

    - `held`: everything the graph reads, kept alive so that no buffer of it is freed and reused;
    - `pinned_at`, `pinned_of(args)`, `pinned_ptrs`: where the owner finds each tensor the graph reads in place
      (an argument position, or an argument's name and path: for messages), the call's such tensors, and their
      addresses at capture. The graph would read (or write) the old memory, so `moved(args)` is checked before a
      replay wherever the caller may hand other tensors;
    - `copy_targets`, `copy_of(args)`: the graph's own buffers, refreshed from the call's tensors before each
      replay;
    - `mirror_targets`, `mirror_of(args)`: the graph's copies of small tensors it writes, copied back to the
      call's after each replay;
    - `shapes`: the extents the graph's dynamic inputs were captured with (baked in as well);
    - `outputs`: the graph's output tensors, rewritten by every replay;
    - `memory_bytes`: what its capture grew the pool by (`CaptureLoop`; 0 outside one).
    """

    __slots__ = ("graph", "outputs", "held", "pinned_at", "pinned_of", "pinned_ptrs", "copy_targets", "copy_of",
                 "mirror_targets", "mirror_of", "shapes", "memory_bytes", "replays")

    def __init__(self, graph, outputs, *, held=None, pinned_at=(), pinned_of: Callable = _nothing,
                 copy_targets=(), copy_of: Callable = _nothing, mirror_targets=(), mirror_of: Callable = _nothing,
                 shapes: dict | None = None, args=None):
        self.graph = graph
        self.outputs = outputs
        self.held = held
        self.pinned_at = list(pinned_at)
        self.pinned_of = pinned_of
        self.pinned_ptrs = list(map(data_ptr, pinned_of(args))) if args is not None else []
        self.copy_targets = list(copy_targets)
        self.copy_of = copy_of
        self.mirror_targets = list(mirror_targets)
        self.mirror_of = mirror_of
        self.shapes = shapes or {}
        self.memory_bytes = 0
        self.replays = 0

    def moved(self, args) -> int | None:
        """The index (in `pinned_at`) of the first tensor of the call `args` that is not where the graph reads
        it, or None."""
        now = list(map(data_ptr, self.pinned_of(args)))
        if now == self.pinned_ptrs:
            return None
        return next(i for i, (a, b) in enumerate(zip(now, self.pinned_ptrs)) if a != b)

    def replay(self, args=None):
        """Copy the call's inputs into the graph's buffers, replay, copy the mirrored buffers back; returns the
        outputs (graph memory: the next replay overwrites them). A graph without copied inputs needs no `args`."""
        if self.copy_targets:
            _compat.copy_many(self.copy_targets, self.copy_of(args))   # a tuple: no list built per replay
        self.graph.replay()
        self.replays += 1
        if self.mirror_targets:
            _compat.copy_many(list(self.mirror_of(args)), self.mirror_targets)
        return self.outputs


def capture_graph(fn: Callable, pool, *, replay: bool = True, **contract) -> CapturedGraph:
    """Record `fn()` into a graph in `pool` and replay it once: capturing only records, so the capturing call's
    results (and a graph that cannot run) come from that first replay. `replay=False`: the caller replays it once
    it has decided to keep the graph (a replay writes the tensors the graph writes in place). `contract`:
    `CapturedGraph`'s keywords, `args` the capturing call (its pinned tensors' addresses are the graph's)."""
    graph, outputs = cuda_runtime.capture(fn, pool)
    if replay:
        graph.replay()
    return CapturedGraph(graph, outputs, **contract)


def positions(indices: list[int]) -> Callable:
    """args -> the values at `indices`, always as a sequence (operator.itemgetter returns a bare value for one)."""
    if not indices:
        return lambda args: ()
    if len(indices) == 1:
        (i,) = indices
        return lambda args: (args[i],)
    return operator.itemgetter(*indices)


def largest_first(sizes: Iterable[int], order: list[int] | None = None) -> list[int]:
    """The order sizes are captured in: the largest first (the later graphs reuse its pool blocks), then in
    `order` (a traffic profile's value order: what a memory budget keeps first), then by size."""
    sizes = sorted(set(sizes), reverse=True)
    if order is None or not sizes:
        return sizes
    ranked = [s for s in order if s in sizes and s != sizes[0]]
    return sizes[:1] + ranked + [s for s in sizes[1:] if s not in ranked]


class CaptureLoop:
    """The capture of one owner's sizes, in the order given (`largest_first`): garbage collection frozen for the
    whole loop, each size admitted by the memory budget before its capture, a size whose capture runs out of
    memory undone and skipped (its calls pad to a larger size or run without a graph), each size's pool growth,
    the pool after each size and the peak reserved while capturing recorded in `memory`, and the loop's time.
    """

    def __init__(self, memory: GraphMemory, device: torch.device | str, label: str):
        self.memory = memory
        self.device = device
        self.label = label
        self.seconds = 0.0
        self.reserved_after: list[int] = []
        self._bar = None

    @contextlib.contextmanager
    def running(self, steps: int = 0, collect: bool = True):
        """The loop: `steps` captures to come, shown on a progress bar (`log.progress`: once they take a while).
        `collect=False`: a capture made while serving, where a full collection first would stall the call."""
        start = time.perf_counter()
        bar = log.progress(steps, f"vgc: capturing {self.label}", unit="graph") if steps else contextlib.nullcontext()
        with frozen_gc() if collect else paused_gc(), bar as self._bar:
            cuda_runtime.synchronize(self.device)
            cuda_runtime.reset_peak_memory(self.device)
            try:
                yield self
            finally:
                self.memory.peak_bytes = max(self.memory.peak_bytes, cuda_runtime.peak_reserved_bytes(self.device))
                self.seconds += time.perf_counter() - start
                self._bar = None

    def capture(self, key: Hashable, size: int, capture: Callable[..., T], *,
                first_estimate: Callable[[], int] | None = None, warm: Callable[[], object] | None = None,
                undo: Callable[[], None] | None = None) -> T | None:
        """`capture()` for `key` (of `size` tokens, or whatever its graphs scale with): its result, or None when
        the budget has no room for it (`first_estimate()`: a run's peak, when no graph has been measured yet), it
        ran out of memory (`undo()` then forgets what it captured part-way), or `capture()` returned None (it
        captured nothing: it says why). `warm()`: a run at this size before the capture (kernels loaded on first
        use, autotuning) whose memory is not the graph's; `capture` is then called with its result."""
        if self._bar is not None:
            self._bar.update(1)
        if first_estimate is not None and not self.memory.admits(key, size, first_estimate):
            return None
        warmed = () if warm is None else (warm(),)
        cuda_runtime.synchronize(self.device)
        before = cuda_runtime.reserved_bytes(self.device)
        try:
            result = capture(*warmed)
            cuda_runtime.synchronize(self.device)
        except torch.OutOfMemoryError as error:
            if undo is not None:
                undo()
            self.memory.out_of_memory(key, capture_failure(error))
            return None
        if result is None:
            return None
        now = cuda_runtime.reserved_bytes(self.device)
        self.memory.captured(key, size, now - before)
        self.reserved_after.append(now)
        if isinstance(result, CapturedGraph):
            result.memory_bytes = self.memory.per_size[key]
        return result

    def summary(self) -> str:
        return (f"{self.label}: {len(self.memory.per_size)} sizes captured in {self.seconds:.2f} s, "
                f"{self.memory.summary()}")
