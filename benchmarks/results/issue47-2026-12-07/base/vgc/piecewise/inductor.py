"""Inductor adaptor: structural keys for pieces (so identical layers compile once) and per-size compiles."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx

from vgc import _compat

logger = logging.getLogger("vgc")


# ---- structural key ----------------------------------------------------------------------------------------------

def _expr(value) -> sympy.Expr | int:
    return _compat.symbolic_expr(value) if isinstance(value, torch.SymInt) else int(value)


def describe_input(value) -> str:
    """A process-independent description of a piece input: what Inductor specialises code on."""
    if isinstance(value, torch.Tensor):
        shape = ",".join(str(_expr(d)) for d in value.shape)
        stride = ",".join(str(_expr(d)) for d in value.stride())
        return f"T[{value.dtype}|{value.device.type}|({shape})|({stride})|{_expr(value.storage_offset())}]"
    if isinstance(value, torch.SymInt):
        return f"S[{_expr(value)}]"
    return f"C[{type(value).__name__}:{value!r}]"


def _describe_target(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    if _compat.operator_names(target):   # a torch operator: "aten.add.Tensor"
        return str(target)
    return _compat.qualified_name(target) or f"{type(target).__module__}.{type(target).__qualname__}"


def _describe_constant(value: Any) -> str:
    text = repr(value)
    if " at 0x" in text:  # object addresses differ per process; the type is the stable part
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return text


def piece_key(gm: fx.GraphModule, example_inputs: list, extra: str = "") -> str:
    """Hash of a piece's computation, independent of node names: identical layers get the same key."""
    names: dict[fx.Node, str] = {}
    lines = []
    placeholders = iter(example_inputs)
    for i, node in enumerate(gm.graph.nodes):
        names[node] = f"v{i}"
        if node.op == "placeholder":
            lines.append(f"v{i}=input {describe_input(next(placeholders))}")
            continue
        args = fx.node.map_aggregate((node.args, node.kwargs),
                                     lambda a: names[a] if isinstance(a, fx.Node) else _describe_constant(a))
        lines.append(f"v{i}={node.op}[{_describe_target(node)}]{args}")
    lines.append(extra)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]


# ---- which input carries the dynamic size -------------------------------------------------------------------------

@dataclass(frozen=True)
class SizeSource:
    """Where a piece's runtime size lives: a SymInt argument, or one dim of a tensor argument."""
    symbol: sympy.Symbol
    arg_index: int
    dim: int | None = None

    def read(self, args) -> int:
        value = args[self.arg_index]
        return value if self.dim is None else value.shape[self.dim]


def free_symbols(example_inputs: list) -> set:
    symbols = set()
    for value in example_inputs:
        parts = [value] if isinstance(value, torch.SymInt) else \
            list(value.shape) + list(value.stride()) if isinstance(value, torch.Tensor) else []
        for part in parts:
            expr = _expr(part)
            if isinstance(expr, sympy.Expr):
                symbols |= expr.free_symbols
    return symbols


def find_size_source(example_inputs: list) -> SizeSource | None:
    """The single symbolic size of a piece, or None if it has none or several (no per-size compiles then)."""
    symbols = free_symbols(example_inputs)
    if len(symbols) != 1:
        return None
    (symbol,) = symbols
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.SymInt) and _expr(value) == symbol:
            return SizeSource(symbol, i)
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if _expr(size) == symbol:
                    return SizeSource(symbol, i, d)
    return None


def concrete_inputs(example_inputs: list, symbol: sympy.Symbol, size: int) -> list:
    """Real zero-filled inputs with the symbol replaced by `size`, for a static-shape compile."""
    def value(x) -> int:
        expr = _expr(x)
        return int(expr.subs({symbol: size})) if isinstance(expr, sympy.Expr) else expr

    out = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            t = torch.empty_strided([value(d) for d in x.shape], [value(s) for s in x.stride()],
                                    dtype=x.dtype, device=x.device)
            out.append(t.zero_() if t.numel() else t)
        elif isinstance(x, torch.SymInt):
            out.append(value(x))
        else:
            out.append(x)
    return out


# ---- compiling ---------------------------------------------------------------------------------------------------

def compile_piece(gm: fx.GraphModule, example_inputs: list, *, size: int | None, size_source: SizeSource | None,
                  inductor_config: dict[str, Any]):
    """One real Inductor compile: the symbolic-size graph (size None) or a static one for `size`."""
    start = time.perf_counter()
    if size is None:
        artifact = _compat.standalone_compile(gm, list(example_inputs), dynamic_shapes="from_tracing_context",
                                              config_patches=inductor_config)
    else:
        inputs = concrete_inputs(example_inputs, size_source.symbol, size)
        artifact = _compat.standalone_compile(gm, inputs, dynamic_shapes="from_example_inputs",
                                              config_patches=inductor_config)
    logger.debug("Inductor compiled a piece for size %s in %.2f s", size or "dynamic",
                 time.perf_counter() - start)
    return artifact


def unwrap_single(fn: Callable) -> Callable:
    """Fresh and reloaded artifacts disagree on single outputs (Tensor vs [Tensor]); always give the Tensor."""
    def call(*args):
        out = fn(*args)
        return out[0] if isinstance(out, (list, tuple)) else out
    return call
