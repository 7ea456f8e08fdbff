"""The CUDA calls vgc makes (graph capture, synchronisation, memory queries, the capture query), in one module:
tests on machines without a GPU substitute these functions and run every graph path on the CPU."""

from __future__ import annotations

import contextlib

import torch

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


@contextlib.contextmanager
def segment_stream():
    """The capture stream, current for a whole forward captured in segments (`begin_segment` ... `end_segment`,
    with eager calls between them on the same stream)."""
    stream = _capture_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def begin_segment(pool: GraphPool):
    """Start recording the current stream's work into a new graph in `pool` (inside `segment_stream()`)."""
    graph = torch.cuda.CUDAGraph()
    pool.graphs.append(graph)
    graph.capture_begin(pool=pool.handle)
    return graph


def end_segment(graph):
    """Stop recording `graph`; returns it, ready to replay."""
    graph.capture_end()
    return graph


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


def allocated_bytes(device) -> int:
    return torch.cuda.memory_allocated(device)


def reset_peak_memory(device) -> None:
    """Start the peak counters over (torch's process-wide statistics: a capture loop measures its own peak)."""
    torch.cuda.reset_peak_memory_stats(device)


def peak_reserved_bytes(device) -> int:
    return torch.cuda.max_memory_reserved(device)


def peak_allocated_bytes(device) -> int:
    return torch.cuda.max_memory_allocated(device)


def peak_allocated_by(fn, device) -> int:
    """The most memory `fn()` allocated at once beyond what was allocated before it (synchronized around)."""
    synchronize(device)
    before = allocated_bytes(device)
    reset_peak_memory(device)
    fn()
    synchronize(device)
    return max(0, peak_allocated_bytes(device) - before)
