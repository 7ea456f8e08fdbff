"""Attention over packed variable-length sequences (`cu_seqlens`), as one opaque custom op.

Vision encoders pack every image (every video frame) of a batch into one token dimension; each sequence attends
only within itself. ``vgc::varlen_attention`` is a default splitting op: the data-dependent layout lives here,
never in a compiled piece.

Layout: query, key, value [T, H, D] -> output [T, H, D]; `cu_seqlens` [N + 1] int32, non-decreasing, sequence n
owns rows cu_seqlens[n]:cu_seqlens[n + 1]. Rows at and beyond cu_seqlens[N] are padding: their output is not
defined (zero on the CPU path); no real row reads them. Empty sequences (repeated entries) are free, which is how
a fixed-size graph buffer holds fewer sequences than slots.

`max_seqlen` bounds the longest sequence; the op uses min(T, max_seqlen), so a fixed-shape graph may pass the
model's largest frame. On CUDA with bf16/fp16 the op calls torch's flash varlen kernel, which reads the lengths
on the device (no host sync: capturable in a CUDA graph); elsewhere it attends sequence by sequence.
"""

from __future__ import annotations

import torch

from vgc import _compat
from vgc.ops.sdpa import sdpa

__all__ = ["varlen_attention", "reference_varlen_attention"]


@torch.library.custom_op("vgc::varlen_attention", mutates_args=())
def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, scale: float) -> torch.Tensor:
    _check(query, key, value, cu_seqlens)
    longest = max(1, min(query.shape[0], max_seqlen))
    kernel = _compat.flash_varlen_attention()
    if kernel is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.int()
        return kernel(query, key, value, cu, cu, longest, longest, scale=scale).contiguous()
    return reference_varlen_attention(query, key, value, cu_seqlens, scale)


@varlen_attention.register_fake
def _(query, key, value, cu_seqlens, max_seqlen, scale):
    # A fresh contiguous tensor, as both real paths return (empty_like would copy the strides of a query sliced
    # out of a fused qkv projection, which the real outputs do not have).
    return query.new_empty(query.shape)


def reference_varlen_attention(query, key, value, cu_seqlens, scale: float) -> torch.Tensor:
    """Sequence by sequence with SDPA (one host sync for the lengths); padding rows are zero."""
    output = query.new_zeros(query.shape)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))   # [H, L, D]
            output[start:end] = sdpa(q, k, v, scale=scale).transpose(0, 1)
    return output


def _check(query, key, value, cu_seqlens) -> None:
    if query.dim() != 3 or key.shape != query.shape or value.shape != query.shape:
        raise ValueError(f"varlen_attention: query, key and value must all be [tokens, heads, head_dim], got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"varlen_attention: cu_seqlens must be a 1-D int32/int64 tensor, got "
                         f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
