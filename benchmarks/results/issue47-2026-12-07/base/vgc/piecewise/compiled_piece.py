"""Runtime of one compiled piece: pick the static artifact for a listed size, else the symbolic one."""

from __future__ import annotations

from typing import Callable

from vgc.counters import counters
from vgc.piecewise.inductor import SizeSource


class CompiledPiece:
    """A callable standing in for one compiled submodule of the split graph."""

    __slots__ = ("name", "key", "dynamic_fn", "static_fns", "size_source", "has_symbols")

    def __init__(self, name: str, key: str, dynamic_fn: Callable, static_fns: dict[int, Callable],
                 size_source: SizeSource | None, has_symbols: bool = True):
        self.name = name
        self.key = key
        self.dynamic_fn = dynamic_fn
        self.static_fns = static_fns
        self.size_source = size_source
        self.has_symbols = has_symbols   # False: fully static inputs, so one CUDA graph serves every call

    def runtime_size(self, args) -> int | None:
        return None if self.size_source is None else int(self.size_source.read(args))

    def __call__(self, *args):
        if self.static_fns:
            fn = self.static_fns.get(self.runtime_size(args))
            if fn is not None:
                counters.static_dispatches += 1
                return fn(*args)
        counters.dynamic_dispatches += 1
        return self.dynamic_fn(*args)

    def __repr__(self) -> str:
        sizes = sorted(self.static_fns)
        return f"CompiledPiece({self.name}, key={self.key[:8]}, static_sizes={sizes})"
