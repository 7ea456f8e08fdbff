"""A stand-in for CUDA graph capture on the CPU, for tests and their worker processes (no environment changes
on import, unlike conftest)."""

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vgc import _compat, cuda_runtime
from vgc.cudagraph.padding import output_tensors
from vgc.cudagraph.runtime import bypass_piece_graphs


# The CUDA-graph runtime on the CPU: a stand-in for graph capture. It keeps what matters about a real graph: a
# replay reads the tensors the graph was captured with, in place, and writes into the same output tensors. A
# runtime that forgets to copy an input in, reads a buffer that moved, or hands out memory the next replay
# overwrites fails as it would on a GPU. tests/test_gpu.py runs the real thing.
class RecordedGraph:
    """Capture ran `fn` once (a real capture records, then its first replay runs); later replays run it again
    on the captured inputs, as it ran while captured (piece graphs bypassed, the stream capturing), and write
    the results into the captured outputs."""

    def __init__(self, fn, outputs, capturing: list):
        self.fn, self.outputs, self.first, self.capturing = fn, outputs, True, capturing

    def replay(self):
        if _first_replay(self):
            return
        with _as_captured(self.capturing), bypass_piece_graphs():
            outputs = self.fn()
        for old, new in zip(output_tensors(self.outputs), output_tensors(outputs)):
            old.copy_(new)


def _first_replay(graph) -> bool:
    """A real capture records, then its first replay runs: here capture already ran, so that replay does nothing."""
    first, graph.first = graph.first, False
    return first


@contextlib.contextmanager
def _as_captured(capturing: list):
    """A replay runs as the capture ran: with the stream reported capturing."""
    capturing[0] = True
    try:
        yield
    finally:
        capturing[0] = False


class _SegmentRecorder(TorchDispatchMode):
    """Records every operator a captured segment runs, with the tensors it ran on (their addresses, in a graph)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class RecordedSegment:
    """A segment of a breakable capture: its replay runs the recorded operators again on the same tensors and
    writes each result into the tensor the capture produced, as a graph's kernels would; no Python of the
    forward runs. The first replay (right after capture) does nothing: capture already ran the operators."""

    def __init__(self, recorder: _SegmentRecorder, capturing: list):
        self.ops, self.first, self.capturing = recorder.ops, True, capturing

    def replay(self):
        if _first_replay(self):
            return
        with _as_captured(self.capturing):
            for func, args, kwargs, out in self.ops:
                fresh = func(*args, **kwargs)
                for old, new in zip(_compat.tree_leaves(out), _compat.tree_leaves(fresh)):
                    if isinstance(old, torch.Tensor) and old is not new:
                        old.copy_(new)


def install_simulated_capture(setattr=setattr) -> None:
    """Graph capture and replay through `RecordedGraph`, on whatever device the tensors are. While `fn` is being
    captured, `runtime.stream_capturing()` says so, as it would on a GPU. `setattr`: monkeypatch's, in a test;
    the builtin in a worker process, which keeps it to its end."""
    capturing = [False]
    # Graph memory, simulated: a captured graph keeps its outputs in the pool, so the pool grows by their bytes.
    pool = {"bytes": 0}

    def capture(fn, pool_handle):
        capturing[0] = True
        try:
            outputs = fn()
        finally:
            capturing[0] = False
        pool["bytes"] += sum(t.numel() * t.element_size() for t in output_tensors(outputs))
        return RecordedGraph(fn, outputs, capturing), outputs

    def begin_segment(pool_handle):
        recorder = _SegmentRecorder()
        recorder.__enter__()
        capturing[0] = True
        return recorder

    def end_segment(recorder):
        capturing[0] = False
        recorder.__exit__(None, None, None)
        return RecordedSegment(recorder, capturing)

    setattr(cuda_runtime, "begin_segment", begin_segment)
    setattr(cuda_runtime, "end_segment", end_segment)
    setattr(cuda_runtime, "segment_stream", contextlib.nullcontext)
    setattr(cuda_runtime, "stream_capturing", lambda: capturing[0])
    # what a model's own code asks (transformers skips its host reads of masks while a stream captures)
    setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    setattr(cuda_runtime, "capture", capture)
    setattr(cuda_runtime, "synchronize", lambda device: None)
    for name in ("reserved_bytes", "peak_reserved_bytes", "allocated_bytes", "peak_allocated_bytes"):
        setattr(cuda_runtime, name, lambda device: pool["bytes"])
    setattr(cuda_runtime, "reset_peak_memory", lambda device: None)
    setattr(cuda_runtime, "new_pool", lambda: None)
    setattr(cuda_runtime, "graphs_supported", lambda device: True)
