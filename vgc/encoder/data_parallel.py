"""Data-parallel encoding: every rank holds the whole batch, encodes its share, and all ranks gather the results.

The assignment is a pure function of the item sizes, so every rank computes the same one without talking; only
the outputs travel (`torch.distributed`: gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch
import torch.distributed as dist


def balance(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Item indices per rank: largest items first, each to the least-loaded rank (ties to the lower rank).
    Each rank's list is in increasing index order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [(0, rank) for rank in range(world_size)]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, rank = heapq.heappop(loads)
        shares[rank].append(i)
        heapq.heappush(loads, (load + sizes[i], rank))
    return [sorted(share) for share in shares]


def gather(local_outputs: list[torch.Tensor], shares: list[list[int]], group=None) -> list[torch.Tensor]:
    """Every rank's per-item outputs, in the callers' item order, on every rank.

    Outputs are `[rows, ...]` tensors whose trailing dims and dtype agree across items; rows may differ.
    """
    rank = dist.get_rank(group)
    if len(local_outputs) != len(shares[rank]):
        raise ValueError(f"rank {rank} produced {len(local_outputs)} outputs for {len(shares[rank])} items")
    rows = [[0] * len(share) for share in shares]
    # Row counts first (small, on the host), so each rank can pad its block to the largest one.
    local_rows = [int(t.shape[0]) for t in local_outputs]
    gathered_rows: list[list[int] | None] = [None] * len(shares)
    dist.all_gather_object(gathered_rows, local_rows, group=group)
    rows = [list(r) for r in gathered_rows]
    template = _template(local_outputs, group)
    block = max(sum(r) for r in rows)
    mine = torch.zeros((block, *template.shape[1:]), dtype=template.dtype, device=template.device)
    if local_outputs:
        flat = torch.cat(local_outputs)
        mine[:flat.shape[0]].copy_(flat)
    blocks = [torch.empty_like(mine) for _ in shares]
    dist.all_gather(blocks, mine, group=group)
    total = sum(len(s) for s in shares)
    ordered: list[torch.Tensor | None] = [None] * total
    for share, share_rows, data in zip(shares, rows, blocks):
        for index, piece in zip(share, torch.split(data[:sum(share_rows)], share_rows)):
            ordered[index] = piece
    return ordered


def _template(local_outputs: list[torch.Tensor], group) -> torch.Tensor:
    """A tensor with the outputs' trailing shape, dtype and device, known on every rank (a rank with no items
    learns it from a rank with some)."""
    described = None
    if local_outputs:
        t = local_outputs[0]
        described = (tuple(t.shape[1:]), str(t.dtype).removeprefix("torch."), str(t.device))
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, described, group=group)
    known = next((d for d in everyone if d is not None), None)
    if known is None:
        return torch.empty(0)
    shape, dtype, device = known
    if local_outputs:
        device = str(local_outputs[0].device)
    elif device.startswith("cuda"):
        device = f"cuda:{torch.cuda.current_device()}"
    return torch.empty((0, *shape), dtype=getattr(torch, dtype), device=device)
