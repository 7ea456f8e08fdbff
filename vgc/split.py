"""Split a Dynamo FX graph at splitting ops (attention) into pieces that compile and pieces that run eagerly."""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name

from vgc import _compat

logger = logging.getLogger("vgc")


@dataclass
class Piece:
    name: str             # attribute name of the submodule in the split module ("submod_3")
    index: int
    is_splitting: bool    # True: runs eagerly (an attention op); False: compiled by Inductor
    module: fx.GraphModule


def op_names(node: fx.Node) -> tuple[str, ...]:
    """The operator names a node answers to: 'ns::op' and, for an overload, 'ns::op.overload'."""
    target = node.target
    if node.op == "call_function":
        if isinstance(target, torch._ops.OpOverloadPacket):
            return (target._qualified_op_name,)
        if isinstance(target, torch._ops.OpOverload):
            base = target._schema.name
            return (base, f"{base}.{target._overloadname}")
        # Dynamo records torch-level functions (F.scaled_dot_product_attention); they answer to their aten name.
        name = getattr(target, "__name__", None)
        if name and _is_torch_function(target) and hasattr(torch.ops.aten, name):
            return (f"aten::{name}",)
    elif node.op == "call_method" and hasattr(torch.ops.aten, str(target)):
        return (f"aten::{target}",)
    return ()


def _is_torch_function(target) -> bool:
    try:
        return _get_qualified_name(target).startswith("torch.")
    except Exception:  # builtins without a resolvable module
        return False


def is_splitting_node(node: fx.Node, splitting_ops: frozenset[str]) -> bool:
    return any(name in splitting_ops for name in op_names(node))


def decompose_size_nodes(gm: fx.GraphModule) -> None:
    """Replace whole `x.size()` values by per-dim values: a torch.Size cannot cross a piece boundary."""
    graph = gm.graph
    for node in list(graph.nodes):
        is_size = (node.op == "call_method" and node.target == "size" and len(node.args) == 1 and not node.kwargs)
        if not is_size:
            continue
        value = node.meta.get("example_value")
        if not isinstance(value, torch.Size):
            continue
        tensor = node.args[0]
        dims = []
        with graph.inserting_after(node):
            for i, d in enumerate(value):
                if isinstance(d, torch.SymInt):
                    dim_node = graph.call_function(torch.ops.aten.sym_size.int, (tensor, i))
                    dim_node.meta["example_value"] = d
                    dims.append(dim_node)
                else:
                    dims.append(int(d))
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
                _replace_uses(user, dims[user.args[1]])
                graph.erase_node(user)
            else:
                _replace_uses_in(user, node, list(dims))
        graph.erase_node(node)
    gm.recompile()


def _replace_uses(node: fx.Node, replacement) -> None:
    """Like `replace_all_uses_with`, but the replacement may be a plain int or a list."""
    for user in list(node.users):
        _replace_uses_in(user, node, replacement)


def _replace_uses_in(user: fx.Node, node: fx.Node, replacement) -> None:
    user.args = _substitute(user.args, node, replacement)
    user.kwargs = _substitute(user.kwargs, node, replacement)


def _substitute(value, node, replacement):
    if value is node:
        return replacement
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, node, replacement) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, node, replacement) for k, v in value.items()}
    return value


def split_graph(gm: fx.GraphModule, splitting_ops: list[str]) -> tuple[fx.GraphModule, list[Piece]]:
    """Split `gm` so that each run of consecutive splitting ops is its own piece, in original order."""
    ops = frozenset(splitting_ops)
    if ops:
        decompose_size_nodes(gm)
    partition: dict[fx.Node, int] = {}
    splitting_ids: set[int] = set()
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        producer = node.args[0] if node.args else None
        if node.op == "call_function" and node.target is operator.getitem and isinstance(producer, fx.Node) \
                and producer in partition:
            # A whole tuple never crosses a boundary: its items stay with the node that made it.
            partition[node] = partition[producer]
            continue
        if is_splitting_node(node, ops):
            if current not in splitting_ids:
                if any(p == current for p in partition.values()):
                    current += 1
                splitting_ids.add(current)
            partition[node] = current
            continue
        if current in splitting_ids:
            current += 1
        partition[node] = current
    split_gm = _compat.split_module(gm, partition)
    pieces = []
    for name, module in split_gm.named_children():
        index = int(name.rsplit("_", 1)[1])
        pieces.append(Piece(name, index, index in splitting_ids, module))
    pieces.sort(key=lambda p: p.index)
    return split_gm, pieces
