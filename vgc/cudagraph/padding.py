"""Padding a call up to a capture size in vgc-owned input buffers, and slicing the outputs back.

A captured graph reads its inputs from fixed addresses, so `vgc.compile` owns one buffer per dynamic input,
sized for the largest capture size. Every dynamic dim is padded by the same amount (capture size minus the
batch size): token inputs grow from T to N, and per-sequence inputs (one more entry for cumulative offsets)
grow by the same number of entries. Pad values are per input: a number (default 0), or "edge" to repeat the
last entry (cumulative offsets stay monotone, padded sequences are empty).

Only the model knows which values are inert (a KV slot of -1 writes nothing; a repeated slot would overwrite a
real token's KV from the second layer on, where padded rows no longer equal the row they copied). So vgc pads
only when `vgc.compile(..., pad_values=...)` says how; without it, graphs serve calls of exactly a capture size.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch

from vgc import _compat
from vgc import cuda_runtime  # module attribute access: tests substitute stream_capturing

PadValue = int | float | str
_KEPT_SHAPES = 256


def padded_size(size: int, capture_sizes: list[int]) -> int | None:
    """The smallest capture size >= size, or None when the size is above every capture size."""
    i = bisect.bisect_left(capture_sizes, size)
    return capture_sizes[i] if i < len(capture_sizes) else None


def pad_into(buffer: torch.Tensor, value: torch.Tensor, dim: int, pad: int, pad_value: PadValue) -> torch.Tensor:
    """Copy `value` into the front of `buffer` along `dim`, pad `pad` more entries, return that view."""
    return pad_many([(buffer, value, dim, pad_value)], pad)[0]


def pad_many(jobs: list[tuple[torch.Tensor, torch.Tensor, int, PadValue]], pad: int,
             slots: list[tuple] | None = None) -> list[torch.Tensor]:
    """`pad_into` for several (buffer, value, dim, pad value) at once: the copies, and the pad entries of a number,
    go in one multi-tensor copy per dtype, since every launch costs host time between replays. A value that
    already is the front of its buffer (an engine writing into vgc's buffers directly) is not copied. `slots`:
    each job's `buffer_slots`, when the caller keeps them."""
    if slots is None:
        slots = [buffer_slots(buffer, value.shape[dim], dim, pad) for buffer, value, dim, _ in jobs]
    targets, sources = [], []
    for (_, front, _), (_, value, _, _) in zip(slots, jobs):
        if value.data_ptr() != front.data_ptr() or value.stride() != front.stride():
            targets.append(front)
            sources.append(value)
    edges = []
    if pad:
        # Pad entries of a number are copied from a tensor of that number, in the same multi-tensor copy as the
        # values: a padded decode call costs no launch per input more than an exact one.
        filled = not cuda_runtime.stream_capturing()
        for (_, _, tail), (_, value, dim, pad_value) in zip(slots, jobs):
            if pad_value == "edge":
                edges.append((tail, value, dim))
            elif filled:
                targets.append(tail)
                sources.append(_filled_like(tail, pad_value))
            else:   # no tensor made in a capture: its fill would run only at the graph's replays
                tail.fill_(pad_value)
    if targets:
        _compat.copy_many(targets, sources)
    for tail, value, dim in edges:
        size = value.shape[dim]
        if size == 0:
            tail.zero_()
        else:
            tail.copy_(value.narrow(dim, size - 1, 1).expand_as(tail))
    return [view for view, _, _ in slots]


_FILLED: dict[tuple, torch.Tensor] = {}   # (shape, dtype, device, value) -> a tensor holding only that value


def _filled_like(tail: torch.Tensor, value: PadValue) -> torch.Tensor:
    key = (tail.shape, tail.dtype, tail.device, value)
    filled = _FILLED.get(key)
    if filled is None:
        if len(_FILLED) >= _KEPT_SHAPES:   # pads of prefill shapes vary without bound: keep a recent few
            _FILLED.clear()
        filled = _FILLED[key] = torch.full(tail.shape, value, dtype=tail.dtype, device=tail.device)
    return filled


def buffer_slots(buffer: torch.Tensor, size: int, dim: int, pad: int) -> tuple:
    """The views of `buffer` that a call of `size` entries padded by `pad` uses: the padded extent, its front
    (the call's entries) and its tail (the pad entries; None without padding)."""
    view = buffer.narrow(dim, 0, size + pad)
    return view, (view.narrow(dim, 0, size) if pad else view), (view.narrow(dim, size, pad) if pad else None)


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) output, in the order `slice_outputs` visits them (pytree leaf order)."""
    return [leaf for leaf in _compat.tree_leaves(out) if isinstance(leaf, torch.Tensor)]


def batch_dims(shapes: list, size: int, other_shapes: list, other_size: int) -> list[tuple[int, ...]] | None:
    """Which dims of each output follow the call's size, from the outputs' shapes at two sizes (or twice at one):
    those equal to the size at both. None when the two calls returned different numbers of tensors. The one rule
    of every owner of graphs: `slice_outputs` cuts exactly these dims back to the real size."""
    if len(shapes) != len(other_shapes):
        return None
    return [tuple(d for d in range(len(now)) if now[d] == size and d < len(then) and then[d] == other_size)
            for now, then in zip(shapes, other_shapes)]


def slice_outputs(outputs: Any, size: int, dims=None) -> Any:
    """Undo the padding on outputs, cutting each tensor's padded dims back to `size`.

    `dims` yields, per output tensor in order, the dims that follow the batch size; without it, dim 0 is cut
    when it is longer than `size` (the usual layout, until the real dims have been learned).
    """
    def cut(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        padded_dims = next(dims) if dims is not None else ((0,) if leaf.dim() and leaf.shape[0] > size else ())
        for d in padded_dims:
            leaf = leaf.narrow(d, 0, size)
        return leaf

    if isinstance(outputs, torch.Tensor):   # the common case, without the pytree walk (per call, host time)
        return cut(outputs)
    return _compat.tree_map(cut, outputs)


class StaticInputs:
    """vgc-owned buffers for the dynamic tensor arguments of a compiled model."""

    def __init__(self, max_size: int, pad_values: dict[str, PadValue] | None):
        self.max_size = max_size
        self.pad_values = pad_values or {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.slack: dict[str, int] = {}   # how far a dim may exceed the batch size (offsets: one more)
        # (pad, each argument's size) -> the buffers' views for such a call: made once per shape, not per call
        # (each narrow is a dispatcher call, microseconds of host time between replays).
        self._slots: dict[tuple, list[tuple]] = {}
        self._limits: dict[tuple, list[tuple]] = {}   # (padded, batch size, names) -> (name, dim, longest extent)

    def reserve(self, name: str, tensor: torch.Tensor, dim: int, batch_size: int) -> None:
        """Size `name`'s buffer from an example; later calls whose dim exceeds the room fall back un-graphed."""
        slack = max(self.slack.get(name, 0), tensor.shape[dim] - batch_size, 0)
        if name in self.buffers and slack <= self.slack[name]:
            return
        shape = list(tensor.shape)
        shape[dim] = self.max_size + slack
        self.buffers[name] = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
        self.slack[name] = slack
        self._slots.clear()   # they view the buffer this one replaced
        self._limits.clear()

    def all_fit(self, arguments: dict, dims: dict[str, int], padded: int, batch_size: int) -> bool:
        """Whether every dynamic argument (name -> its padded dim), padded by `padded - batch_size`, fits its
        buffer; each one's room for a call of this size is worked out once."""
        key = (padded, batch_size, *dims)
        limits = self._limits.get(key)
        if limits is None:
            if len(self._limits) >= _KEPT_SHAPES:
                self._limits.clear()
            limits = self._limits[key] = [
                (name, dim, self.buffers[name].shape[dim] - padded + batch_size if name in self.buffers else -1)
                for name, dim in dims.items()]
        return all([arguments[name].shape[dim] <= room for name, dim, room in limits])

    def pad_to(self, arguments: dict, dims: dict[str, int], extents: dict[str, int]) -> dict | None:
        """Every dynamic argument copied into its buffer and padded up to its own extent (inputs that count
        sequences grow by fewer entries than those that count tokens); None when one is longer than that."""
        out = {}
        for name, dim in dims.items():
            value = arguments[name]
            pad = extents[name] - value.shape[dim]
            if pad < 0:
                return None
            out[name] = pad_into(self.buffers[name], value, dim, pad, self.pad_values.get(name, 0))
        return out

    def pad_all(self, arguments: dict, dims: dict[str, int], pad: int) -> dict:
        """Every dynamic argument (name -> its padded dim) copied into its buffer and padded by `pad`."""
        jobs = [(self.buffers[name], arguments[name], dim, self.pad_values.get(name, 0)) for name, dim in dims.items()]
        key = (pad, *(value.shape[dim] for _, value, dim, _ in jobs))
        slots = self._slots.get(key)
        if slots is None:
            if len(self._slots) >= _KEPT_SHAPES:   # prefill shapes vary without bound: keep a recent few
                self._slots.clear()
            slots = self._slots[key] = [buffer_slots(buffer, value.shape[dim], dim, pad)
                                        for buffer, value, dim, _ in jobs]
        return dict(zip(dims, pad_many(jobs, pad, slots)))
