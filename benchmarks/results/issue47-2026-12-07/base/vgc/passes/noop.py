"""No-op elimination: views, reshapes, slices and expands whose result has the input's shape are the input.

Inductor removes many such nodes itself before custom passes run; this pass removes what is left (the shapes are
compared with `statically_known_true`, so symbolic sizes count as equal only when they provably are).
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten
_SAME_SHAPE_IS_NOOP = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.slice.Tensor,
                       aten.expand.default, aten.alias.default}


def eliminate_noops(graph: fx.Graph) -> int:
    """Remove the no-op nodes of `graph`; returns how many."""
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SAME_SHAPE_IS_NOOP or not node.args:
            continue
        source = node.args[0]
        if not isinstance(source, fx.Node) or not _same_shape(node, source):
            continue
        if node.target is aten.slice.Tensor and (node.args[4:5] or [1])[0] != 1:
            continue
        node.replace_all_uses_with(source)
        graph.erase_node(node)
        removed += 1
    return removed


def _same_shape(node: fx.Node, source: fx.Node) -> bool:
    out, into = node.meta.get("val"), source.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(into, torch.Tensor) or out.dim() != into.dim():
        return False
    return all(statically_known_true(a == b) for a, b in zip(out.shape, into.shape)) and \
        all(statically_known_true(a == b) for a, b in zip(out.stride(), into.stride()))
