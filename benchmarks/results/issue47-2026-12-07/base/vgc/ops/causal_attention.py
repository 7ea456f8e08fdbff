"""`vgc::causal_attention`: causal attention of a batch of padded sequences against their whole KV so far.

The shape transformers' models attend in: queries [batch, heads, q, dim], keys and values [batch, kv_heads, kv,
dim] (the cache's, new tokens last), an optional padding mask [batch, kv]: bool (True = a real token) as generate()
keeps it, or an additive bias in the queries' dtype, added to the scores as it is (`padding_bias` makes one of 0 =
real and -inf = padding), which a caller makes once per step for every layer: on a GPU, SDPA would otherwise
turn a bool mask into a bias, and pad it for its memory-efficient kernel, in every layer. The causal mask is built
here, from the shapes of this call, so a caller that runs this op eagerly between captured segments (breakable CUDA
graphs) serves every KV length with one capture.
"""

from __future__ import annotations

import torch

from vgc.ops.sdpa import sdpa

_ALIGN = 16   # elements: a bias row stride SDPA's memory-efficient kernel takes as it is


@torch.library.custom_op("vgc::causal_attention", mutates_args=())
def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, padding_mask: torch.Tensor | None,
                     scale: float, window: int | None) -> torch.Tensor:
    """[batch, heads, q, dim] queries, the last q of kv positions, against keys/values [batch, kv_heads, kv, dim];
    returns [batch, q, heads, dim]. `window`: a sliding window, each query seeing itself and the window - 1 keys
    before it (transformers' `sliding_window`), or None. A padding mask longer than kv covers tokens a
    sliding-window cache no longer keeps: its last kv columns are the keys'. A query row with no key to attend (a
    left-padding token) attends to all: its output is finite and unused."""
    _check(query, key, value, padding_mask, window)
    batch, heads, q, dim = query.shape
    kv_heads, kv = key.shape[1], key.shape[2]
    if padding_mask is not None and padding_mask.shape[1] > kv:
        padding_mask = padding_mask[:, -kv:]
    if q == 1 and window is not None and kv > window:   # keys before the window: out of sight, sliced off (views)
        key, value = key[:, :, kv - window:], value[:, :, kv - window:]
        padding_mask = None if padding_mask is None else padding_mask[:, kv - window:]
        kv = window
    if q == 1:
        # A decode step: every key is in its past, so padding is all the mask says (a view, no kernel; the step's
        # own token is real, so no row is empty). The heads that share a KV head become that head's queries, so
        # grouped heads read the cache in place rather than a repeated copy of it.
        mask = None
        if padding_mask is not None and padding_mask.is_floating_point():
            if padding_mask.storage_offset() % _ALIGN or padding_mask.stride(0) % _ALIGN:
                # a sliding window's last columns (or a caller's own bias): the memory-efficient kernel reads the
                # bias in aligned vectors and faults on a misaligned start (H200: "misaligned address"); one copy
                # into aligned rows keeps its values
                padding_mask = _aligned_rows(padding_mask.shape, padding_mask.dtype, padding_mask.device).copy_(
                    padding_mask)
            # [batch, 1, 1, kv] keeping the rows' stride for every leading dim: aligned as padding_bias made it
            row = padding_mask.stride(0)
            mask = padding_mask.as_strided((batch, 1, 1, kv), (row, row, row, padding_mask.stride(1)))
        elif padding_mask is not None:
            mask = padding_mask.to(torch.bool)[:, None, None, :]
        grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
        out = sdpa(grouped, key, value, attn_mask=mask, scale=scale)
        return out.reshape(batch, 1, heads, dim)
    if heads != kv_heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    if padding_mask is None and q == kv and (window is None or window >= kv):
        out = sdpa(query, key, value, is_causal=True, scale=scale)
    else:
        positions = torch.arange(kv, device=query.device)
        allowed = positions[None, :] <= positions[kv - q:, None]                 # [q, kv]
        if window is not None:
            allowed = allowed & (positions[None, :] > positions[kv - q:, None] - window)
        if padding_mask is not None and padding_mask.is_floating_point():
            # a bias keeps its values, as in a decode step (padding_bias's are 0 and -inf; a caller's may be any)
            mask = padding_mask[:, None, :].masked_fill(~allowed, float("-inf"))    # [batch, q, kv]
            mask = mask.masked_fill(torch.isneginf(mask).all(dim=-1, keepdim=True), 0)
        else:
            if padding_mask is not None:
                allowed = allowed[None] & padding_mask.to(torch.bool)[:, None, :]     # [batch, q, kv]
            mask = allowed | ~allowed.any(dim=-1, keepdim=True)
        out = sdpa(query, key, value, attn_mask=mask.unsqueeze(-3), scale=scale)
    return out.transpose(1, 2).contiguous()


def padding_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a [batch, kv] padding mask (nonzero = real) for `causal_attention`: [batch, kv] of 0 and
    -inf in `dtype`, its rows a multiple of 16 elements apart."""
    return _aligned_rows(mask.shape, dtype, mask.device).zero_().masked_fill_(mask.logical_not(), float("-inf"))


def _aligned_rows(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised [batch, kv] tensor whose rows start a multiple of 16 elements apart."""
    batch, kv = shape
    return torch.empty(batch, kv + (-kv % _ALIGN), dtype=dtype, device=device)[:, :kv]


@causal_attention.register_fake
def _(query, key, value, padding_mask, scale, window):
    return query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])


def _check(query, key, value, padding_mask, window) -> None:
    def fail(msg):
        raise ValueError(f"vgc::causal_attention: {msg}")

    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape:
        fail(f"query must be [batch, heads, q, dim] and key/value [batch, kv_heads, kv, dim] alike, got "
             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3] or query.shape[1] % key.shape[1]:
        fail(f"key {tuple(key.shape)} does not fit query {tuple(query.shape)} (same batch and dim, heads a "
             "multiple of kv_heads)")
    if query.shape[2] > key.shape[2]:
        fail(f"{query.shape[2]} queries but only {key.shape[2]} keys: the keys must include the queries' own")
    if padding_mask is not None and (padding_mask.dim() != 2 or padding_mask.shape[0] != key.shape[0]
                                     or padding_mask.shape[1] < key.shape[2]):
        fail(f"padding_mask must be [batch, kv] = {(key.shape[0], key.shape[2])} (or longer, for a sliding-window "
             f"cache that keeps only its last kv tokens), got {tuple(padding_mask.shape)}")
    if window is not None and window < 1:
        fail(f"window must be a positive number of tokens, got {window}")
    if padding_mask is not None and padding_mask.is_floating_point() and padding_mask.dtype != query.dtype:
        fail(f"a float padding_mask is an additive bias in the queries' dtype {query.dtype}, got "
             f"{padding_mask.dtype} (padding_bias(mask, query.dtype) makes one)")
