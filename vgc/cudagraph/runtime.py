"""State shared by every CUDA graph of one compiled model: the memory pool, capture permission, stable addresses."""

from __future__ import annotations

import contextlib
import gc
import threading

import torch

_pools: dict[int, object] = {}
_local = threading.local()


def graph_pool(device: torch.device):
    """One pool per device for every graph vgc captures: captured largest-first, smaller graphs reuse blocks."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _pools:
        _pools[index] = torch.cuda.graph_pool_handle()
    return _pools[index]


def full_graph_active() -> bool:
    """True while a whole-forward (FULL) graph is captured: piece graphs must then run their code inline."""
    return getattr(_local, "full", False)


@contextlib.contextmanager
def full_graph_capture():
    _local.full = True
    try:
        yield
    finally:
        _local.full = False


@contextlib.contextmanager
def frozen_gc():
    """No garbage collection while capturing: a collection can free memory a graph is being recorded into."""
    gc.collect()
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


class GraphRuntime:
    """Per-model switches and records: which sizes to capture, whether capturing is still allowed, and the
    addresses that stay valid across replays (graph outputs, vgc-owned input buffers, model weights)."""

    def __init__(self, capture_sizes: list[int], piecewise: bool):
        self.capture_sizes = frozenset(capture_sizes)
        self.piecewise = piecewise
        self.capture_allowed = True
        self.stable_ptrs: set[int] = set()
        self.debug = False
        self.pieces: list = []   # the CUDAGraphPiece wrappers, for statistics

    def is_stable(self, tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() in self.stable_ptrs

    def mark_stable(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.stable_ptrs.add(t.data_ptr())
