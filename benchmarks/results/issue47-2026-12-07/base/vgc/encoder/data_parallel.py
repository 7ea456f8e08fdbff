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
    # Row counts and the outputs' trailing shape first, in one small host exchange: each rank pads its block to
    # the largest, and a rank without items learns the shape from one with some.
    described = None
    if local_outputs:
        t = local_outputs[0]
        described = (tuple(t.shape[1:]), str(t.dtype).removeprefix("torch."))
    everyone: list = [None] * len(shares)
    dist.all_gather_object(everyone, ([int(t.shape[0]) for t in local_outputs], described), group=group)
    rows = [r for r, _ in everyone]
    known = next((d for _, d in everyone if d is not None), None)
    if known is None:   # no rank had an item
        return []
    shape, dtype = known
    device = local_outputs[0].device if local_outputs else _collective_device(group)
    mine = torch.zeros((max(sum(r) for r in rows), *shape), dtype=getattr(torch, dtype), device=device)
    if local_outputs:
        flat = torch.cat(local_outputs)
        mine[:flat.shape[0]].copy_(flat)
    blocks = [torch.empty_like(mine) for _ in shares]
    dist.all_gather(blocks, mine, group=group)
    ordered: list[torch.Tensor | None] = [None] * sum(len(s) for s in shares)
    for share, share_rows, data in zip(shares, rows, blocks):
        for index, piece in zip(share, torch.split(data[:sum(share_rows)], share_rows)):
            ordered[index] = piece
    return ordered


def _collective_device(group) -> torch.device:
    """Where this rank's tensors for the group's backend live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
