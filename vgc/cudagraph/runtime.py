"""State shared by every CUDA graph of one compiled model: the memory pool, capture permission, stable addresses."""

from __future__ import annotations

import contextlib
import gc
import threading

import torch

from vgc.counters import Counters
from vgc.cudagraph.padding import output_tensors

_local = threading.local()


def piece_graphs_bypassed() -> bool:
    """True while piece graphs must run their code inline: inside a FULL capture, or a debug reference run."""
    return getattr(_local, "bypass", False)


@contextlib.contextmanager
def bypass_piece_graphs():
    was, _local.bypass = piece_graphs_bypassed(), True
    try:
        yield
    finally:
        _local.bypass = was


# A CUDA build of torch on a machine without a usable GPU raises from torch's capture query too ("CUDA driver
# version is insufficient"), so both are checked, once.
_CUDA_USABLE = torch.backends.cuda.is_built() and torch.cuda.is_available()


def stream_capturing() -> bool:
    """The current CUDA stream is being captured into a graph (False where no GPU can be used: a torch built
    without CUDA, or no driver, where torch's own query raises). Tests on the CPU substitute it while their
    stand-in for `capture` runs."""
    return _CUDA_USABLE and torch.cuda.is_current_stream_capturing()


class GraphPool:
    """A CUDA graph memory pool and every graph ever captured into it.

    torch's pool handle is a bare id: the pool lives only while a graph that began capturing into it does, and
    capturing into a pool whose graphs were all freed trips an assertion in the caching allocator. A graph
    replaced by another (an input moved) or a capture that failed would free the last one; holding every graph
    here keeps the pool for as long as its owner holds this object. A graph's memory is the pool's, so the old
    graphs cost only their small executable objects.
    """

    def __init__(self):
        self.handle = torch.cuda.graph_pool_handle()
        self.graphs: list = []


def capture(fn, pool: GraphPool):
    """Record `fn()` into a new CUDA graph in `pool`; returns the graph and fn's outputs (its static buffers).

    The one place vgc captures: tests on machines without a GPU replace it with a stand-in whose replay
    re-runs `fn` into the same output tensors, which keeps the address semantics of a real graph.
    """
    # capture_begin/end on a side stream is what torch.cuda.graph does, minus the gc.collect() and
    # torch.cuda.empty_cache() it runs on every entry: callers freeze the collector once around a whole capture
    # loop, and emptying the cache per graph made every following warm-up run allocate afresh.
    graph = torch.cuda.CUDAGraph()
    pool.graphs.append(graph)   # before capture_begin: a failed capture must not free the pool either
    stream = _capture_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool.handle)
        try:
            outputs = fn()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, outputs


_capture_streams: dict[int, torch.cuda.Stream] = {}


def _capture_stream(device_index: int):
    """One side stream per device for every capture (a graph must not be captured on the default stream)."""
    if device_index not in _capture_streams:
        _capture_streams[device_index] = torch.cuda.Stream(device_index)
    return _capture_streams[device_index]


def graphs_supported(device: torch.device) -> bool:
    return device.type == "cuda"


def new_pool() -> GraphPool:
    """A fresh memory pool for graphs that share memory (they are replayed one at a time)."""
    return GraphPool()


def synchronize(device) -> None:
    torch.cuda.synchronize(device)


def reserved_bytes(device) -> int:
    return torch.cuda.memory_reserved(device)



@contextlib.contextmanager
def paused_gc():
    """No garbage collection while capturing (a collection can free memory a graph is being recorded into), and
    no collection first: for captures made while serving (drop-in graphs capture on a signature's second call),
    where a full collection of a process holding Dynamo's and Inductor's objects stalls the call for a large
    fraction of a second (0.6 s measured on the CPU stand-in)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def frozen_gc():
    """`paused_gc` around a warm-up's whole capture loop, after one collection whose survivors are frozen."""
    gc.collect()
    gc.freeze()
    try:
        with paused_gc():
            yield
    finally:
        gc.unfreeze()


class ReplaySampler:
    """Debug mode's choice of replays to check: the first at each key (a size, a call signature), then one in
    100."""

    def __init__(self):
        self.calls: dict = {}

    def due(self, key) -> bool:
        count = self.calls.get(key, 0)
        self.calls[key] = count + 1
        return count % 100 == 0


def check_replay(out, rerun, where: str) -> None:
    """Debug: compare a replay's outputs with `rerun()`, the same call run here without graphs (piece graphs
    bypassed); `RuntimeError` naming `where` on a mismatch. The re-run repeats the call's in-place writes (KV
    caches) with the same values."""
    replayed = [t.clone() for t in output_tensors(out)]
    with bypass_piece_graphs():
        reference = output_tensors(rerun())
    for got, want in zip(replayed, reference):
        tolerance = 5e-2 if got.dtype in (torch.bfloat16, torch.float16) else 1e-3
        if got.shape != want.shape or not torch.allclose(got, want, atol=tolerance, rtol=tolerance):
            worst = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else "shape"
            raise RuntimeError(f"vgc debug: the CUDA-graph replay at {where} differs from the un-graphed run "
                               f"(max |diff| {worst}); a graph read a stale or moved buffer")


def capture_failure(error: Exception) -> str:
    """A failed capture's error in one line, for the warning that says what runs instead."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


class GraphRuntime:
    """Per-model graph state: which sizes to capture, when capturing is allowed, the memory pool, the addresses
    that stay valid across replays (graph outputs, vgc-owned input buffers, model weights) and the model's
    counters record.

    `capture_on_demand` is the drop-in rule: a piece captures the second time it meets a capture size. Without
    it (`vgc.compile`), pieces capture only inside `capturing()`, which warm-up opens around its capture loop.
    """

    def __init__(self, capture_sizes: list[int], *, debug: bool = False, capture_on_demand: bool,
                 counters: Counters):
        self.capture_sizes = frozenset(capture_sizes)
        self._capture_allowed = capture_on_demand
        self.stable_ptrs: set[int] = set()
        self.debug = debug
        self.counters = counters
        self.pieces: list = []   # the CUDAGraphPiece wrappers, for statistics
        self._pool = None

    @property
    def capture_allowed(self) -> bool:
        return self._capture_allowed

    @contextlib.contextmanager
    def capturing(self):
        """Capture is allowed inside this block only (unless it was allowed on demand anyway)."""
        was_allowed, self._capture_allowed = self._capture_allowed, True
        try:
            yield
        finally:
            self._capture_allowed = was_allowed

    def pool(self):
        """The one memory pool of this model's graphs, captured largest-first so smaller graphs reuse blocks.

        Owned here, not per process: the pool (`GraphPool`, which holds every graph captured into it) lives as
        long as the model.
        """
        if self._pool is None:
            self._pool = new_pool()
        return self._pool

    def is_stable(self, tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() in self.stable_ptrs

    def mark_stable(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.stable_ptrs.add(t.data_ptr())
