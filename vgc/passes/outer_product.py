"""Outer products: a matmul whose inner dim is 1 becomes a broadcast multiply.

transformers' rotary embedding computes its angles as `inv_freq[:, None] @ positions[None, :]` in fp32 (every
family spells it so), a batched matmul with K = 1. Inductor hands it to cuBLAS (on an H100, a cutlass SGEMM of
3.5 µs and the small kernels around it, in every decode step); as a multiply it fuses into the cos/sin kernel that
reads it. torch 2.13's decompositions turn such a `bmm` into the multiply themselves (before this pass runs, so
it finds nothing there); the pass gives the same to torch 2.11 and 2.12, and to `mm`.

Before / after, in a piece (`f` is [B, d/2, 1], `p` is [B, 1, T]):

    y = aten.bmm(f, p)        ->        y = aten.mul(f, p)

The product of one term is the same number either way: cuBLAS accumulates bf16/fp16 products in fp32 (exact for
them) and rounds once, as Inductor's multiply does; an fp32 product is one rounding in both. Only TF32 changes
that (cuBLAS rounds the fp32 inputs first; so does oneDNN's TF32 or bf16 mode on the CPU), so fp32 products stay
matmuls while their device's matmuls may round fp32 inputs.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from vgc import _compat

aten = torch.ops.aten
_EXACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def options() -> dict:
    """What, besides this module's source, decides the pass's output (it joins the pass's cache identity)."""
    return {"reduced_fp32": {device: _compat.reduced_fp32_matmuls(device) for device in ("cuda", "cpu")}}


def rewrite_outer_products(graph: fx.Graph) -> int:
    """Rewrite `graph`'s `mm`/`bmm` nodes whose inner dim is statically 1; returns how many."""
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.bmm.default) or node.kwargs:
            continue
        a, b = node.args
        if not _eligible(node, a, b):
            continue
        with graph.inserting_before(node):
            product = graph.call_function(aten.mul.Tensor, (a, b))
        product.meta.update(node.meta)
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _eligible(node: fx.Node, a, b) -> bool:
    if not isinstance(a, fx.Node) or not isinstance(b, fx.Node):
        return False
    a_val, b_val, out = a.meta.get("val"), b.meta.get("val"), node.meta.get("val")
    if not all(isinstance(v, torch.Tensor) for v in (a_val, b_val, out)):
        return False
    if a_val.dtype not in _EXACT_DTYPES or b_val.dtype != a_val.dtype or b_val.device != a_val.device:
        return False
    if a_val.dtype == torch.float32 and _compat.reduced_fp32_matmuls(a_val.device.type):
        return False
    # A K of 1 in the batch dims too: bmm's operands share their batch size, so the multiply broadcasts only M, N
    return bool(statically_known_true(a_val.shape[-1] == 1) and statically_known_true(b_val.shape[-2] == 1))
