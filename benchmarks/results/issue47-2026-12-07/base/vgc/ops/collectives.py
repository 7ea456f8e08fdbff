"""Collectives as custom ops that stay inside compiled pieces.

``vgc::all_reduce`` is opaque to Dynamo and Inductor: the graph records one call, Inductor compiles the code around
it and calls the op as an extern kernel, and a CUDA graph of the piece captures the NCCL launch. It is not a
splitting op, so a tensor-parallel layer stays one piece (row-parallel matmul, all-reduce, residual add, norm).

The op is functional (it returns a new tensor), so functionalisation adds no copies around it. A process group
cannot be a graph constant; the graph holds its name, which `register_group` maps back to the group in every
process that builds the model. Group names are assigned in creation order, so they agree across ranks and across
runs that create their groups in the same order, which keeps compiled artifacts reusable from the cache.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vgc import _compat
from vgc.distributed import initialized

__all__ = ["all_reduce", "register_group", "group_named"]

_GROUPS: dict[str, "dist.ProcessGroup"] = {}


def register_group(group: "dist.ProcessGroup | None" = None) -> str:
    """The name `vgc::all_reduce` calls `group` by (the default group when None); remembers the group for it."""
    if not initialized():
        raise RuntimeError("vgc::all_reduce needs torch.distributed: call torch.distributed.init_process_group() "
                           "before building a tensor-parallel model")
    group = group if group is not None else dist.group.WORLD
    name = group.group_name
    _GROUPS[name] = group
    return name


def group_named(name: str) -> "dist.ProcessGroup":
    group = _GROUPS.get(name)
    if group is None:
        world = dist.group.WORLD if initialized() else None
        if world is not None and world.group_name == name:
            return world
        raise RuntimeError(f"vgc::all_reduce: no process group named {name!r} in this process (known: "
                           f"{sorted(_GROUPS)}); build the model after init_process_group(), with the group "
                           "registered through vgc.ops.collectives.register_group(group)")
    return group


@torch.library.custom_op("vgc::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Sum of `x` over the ranks of the group named `group_name`, as a new contiguous tensor."""
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group_named(group_name))
    return out


@all_reduce.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# Namespaces whose ops talk to other ranks: vgc's own op and torch's functional collectives.
_COLLECTIVE_NAMESPACES = ("_c10d_functional::", "c10d_functional::", "c10d::")


def collective_calls(gm: "torch.fx.GraphModule") -> int:
    """How many calls in `gm` are collectives: a model that makes any needs every rank to run it together."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        names = _compat.operator_names(node.target)
        if any(n.split(".")[0] == "vgc::all_reduce" or n.startswith(_COLLECTIVE_NAMESPACES) for n in names):
            count += 1
    return count
