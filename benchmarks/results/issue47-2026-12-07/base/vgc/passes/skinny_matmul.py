"""Skinny matmuls: each `mm` (and `addmm`) that may run with few rows becomes `vgc::skinny_mm`.

Before, in a decode piece (`a` is the normed hidden state, `w` a linear's weight):

    t = aten.permute(w, [1, 0]);  y = aten.mm(a, t)             # cuBLAS
    z = aten.addmm(bias, a, t)

After:

    t = aten.permute(w, [1, 0]);  y = vgc.skinny_mm(a, t)       # vgc's kernel when a has <= MAX_M rows, else mm
    z = aten.add(vgc.skinny_mm(a, t), bias)

Only where the op can take the kernel path: bf16/fp16 on CUDA, the second operand K-contiguous (a weight's
transpose), and a row count that is symbolic or at most `MAX_M`. The op decides per call from shapes, so a
symbolic-size piece keeps cuBLAS for prefill batches and a CUDA graph captures whichever path its size takes.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from vgc import envs
from vgc.ops.skinny_mm import DTYPES, MAX_M

aten = torch.ops.aten


def options() -> dict:
    """What, besides this module's source, decides the pass's output (it joins the pass's cache identity)."""
    return {"max_m": MAX_M, "on_cpu": envs.skinny_mm_on_cpu()}


def use_skinny_matmuls(graph: fx.Graph) -> int:
    """Rewrite `graph`'s eligible `mm`/`addmm` nodes; returns how many."""
    devices = ("cuda", "cpu") if envs.skinny_mm_on_cpu() else ("cuda",)
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.mm.default:
            a, b = node.args
        elif node.target is aten.addmm.default:
            bias, a, b = node.args
        else:
            continue
        if not _eligible(a, b, devices):
            continue
        with graph.inserting_before(node):
            product = graph.call_function(torch.ops.vgc.skinny_mm.default, (a, b))
            product.meta["val"] = _product_val(node, a, b)
            if node.target is aten.addmm.default:
                result = graph.call_function(aten.add.Tensor, (product, bias))
                result.meta["val"] = node.meta.get("val")
            else:
                result = product
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _eligible(a, b, devices) -> bool:
    if not isinstance(a, fx.Node) or not isinstance(b, fx.Node):
        return False
    a_val, b_val = a.meta.get("val"), b.meta.get("val")
    if not isinstance(a_val, torch.Tensor) or not isinstance(b_val, torch.Tensor):
        return False
    if a_val.dim() != 2 or b_val.dim() != 2 or a_val.dtype not in DTYPES or b_val.dtype != a_val.dtype:
        return False
    if a_val.device.type not in devices or b_val.device != a_val.device:
        return False
    rows = a_val.shape[0]
    if isinstance(rows, int) and rows > MAX_M:   # a static size the kernel never takes: leave cuBLAS's mm alone
        return False
    return bool(statically_known_true(b_val.stride(0) == 1))


def _product_val(node: fx.Node, a: fx.Node, b: fx.Node):
    val = node.meta.get("val")
    if node.target is aten.mm.default or val is None:
        return val
    a_val, b_val = a.meta["val"], b.meta["val"]
    return a_val.new_empty((a_val.shape[0], b_val.shape[1]))
