"""State shared by every CUDA graph of one compiled model: the memory pool, capture permission, stable addresses."""

from __future__ import annotations

import contextlib
import gc
import threading

import torch

from vgc import cuda_runtime  # module attribute: tests substitute new_pool()
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
            self._pool = cuda_runtime.new_pool()
        return self._pool

    def is_stable(self, tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() in self.stable_ptrs

    def mark_stable(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.stable_ptrs.add(t.data_ptr())
