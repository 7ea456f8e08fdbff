"""Paged attention over flattened tokens, as one opaque custom op.

The op is deliberately opaque to the compiler: ``vgc::attention`` is the op at
which the backend splits graphs, so everything data-dependent (per-sequence
lengths, cache gathers) lives here and never in the traced model.

Layout (vLLM-style):
  query [T, Hq, D]; key, value [T, Hkv, D]; output [T, Hq, D]
  key_cache, value_cache [num_blocks, block_size, Hkv, D]
  slot_mapping [T]: flat cache slot per token, negative = write nothing
  block_table [B, max_blocks_per_seq]; seq_lens [B] (context incl. new tokens)
  query_start_loc [B + 1]: sequence b owns query rows qsl[b]:qsl[b+1]

Output rows at and beyond ``query_start_loc[B]`` (padding tokens) are zeroed,
so that padded batches produce deterministic, NaN-free outputs.

Contract of the CUDA path: a batch with as many tokens as sequences is a decode
batch, one token per sequence (token t is sequence t's last position). It is
served by a Triton kernel that reads every length on the device (no host sync,
so it can be captured in a CUDA graph); there a padding row attends like the
sequence it pads (nothing, for a padded length 0). Other batches read their
lengths on the host, so capturing one raises (the caller captures it
piecewise instead) rather than record a kernel for the wrong batch.

Those host reads are syncs: the host waits for the GPU before it can launch
the rest. Inside one forward call of a compiled model (`lengths_read_once`)
the layers share one read of a given pair of length tensors, so a prefill
step syncs once, not once per layer, and the host queues the other layers'
work while the GPU runs.
"""

from __future__ import annotations

import contextvars
import functools
import logging

import torch

from vgc import _compat, cuda_runtime  # cuda_runtime as a module attribute: tests substitute it
from vgc.ops import triton_attention
from vgc.ops.sdpa import sdpa

__all__ = ["attention", "reference_attention"]

_INDEX_DTYPES = (torch.int32, torch.int64)

logger = logging.getLogger("vgc")


@torch.library.custom_op(
    "vgc::attention", mutates_args=("output", "key_cache", "value_cache")
)
def attention(
    output: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    _paged_attention(
        output, query, key, value, key_cache, value_cache, slot_mapping,
        block_table, seq_lens, query_start_loc, scale,
        use_sdpa=query.device.type == "cuda", alibi_slopes=alibi_slopes,
    )


@attention.register_fake
def _(output, query, key, value, key_cache, value_cache,
      slot_mapping, block_table, seq_lens, query_start_loc, scale, alibi_slopes=None) -> None:
    # Mutation-only op: nothing to allocate, so the fake has nothing to do.
    return None


def _paged_attention(output, query, key, value, key_cache, value_cache,
                     slot_mapping, block_table, seq_lens, query_start_loc,
                     scale, use_sdpa, alibi_slopes=None):
    _check_args(output, query, key, value, key_cache, value_cache,
                slot_mapping, block_table, seq_lens, query_start_loc)
    if alibi_slopes is not None:
        _check_slopes(alibi_slopes, query)
    decode = query.shape[0] == seq_lens.shape[0]
    use_triton = use_sdpa and triton_attention.HAS_TRITON and query.is_cuda
    if not decode and cuda_runtime.stream_capturing():
        if query.shape[0] > _MAX_TOKENS_PER_SEQUENCE_IN_GRAPH * seq_lens.shape[0]:
            raise RuntimeError(
                f"vgc::attention cannot run inside a CUDA graph capture for {query.shape[0]} tokens over "
                f"{seq_lens.shape[0]} sequences: a graph takes at most {_MAX_TOKENS_PER_SEQUENCE_IN_GRAPH} tokens "
                "per sequence (decode, speculative decoding), which attend without a host sync; capture such "
                "batches as PIECEWISE graphs (attention between the graphs)")
        # Several tokens per sequence inside a graph (speculative decoding's 1 + k): no host sync allowed (the
        # pure-torch KV write selects valid slots on the host: a GPU capture needs Triton's)
        if use_triton:
            triton_attention.write_kv(key, value, key_cache, value_cache, slot_mapping)
        else:
            _write_kv(key, value, key_cache, value_cache, slot_mapping)
        _attend_on_device(output, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale,
                          alibi_slopes)
        return
    if use_triton and decode and alibi_slopes is not None:
        # The decode kernels add no position bias: ALiBi decode attends on the device in plain torch (no host
        # sync, so CUDA graphs still hold it)
        triton_attention.write_kv(key, value, key_cache, value_cache, slot_mapping)
        _attend_on_device(output, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale,
                          alibi_slopes)
        return
    if use_triton and decode:
        # As many tokens as sequences means one token per sequence (the op's contract): token t is sequence
        # t's last position. Decided from shapes, with no host sync, so it also runs inside a CUDA graph.
        # One kernel writes the new K/V and attends.
        triton_attention.decode_attention(output, query, key, value, key_cache, value_cache, slot_mapping,
                                          block_table, seq_lens, scale)
        return
    if use_triton:
        triton_attention.write_kv(key, value, key_cache, value_cache, slot_mapping)
    else:
        _write_kv(key, value, key_cache, value_cache, slot_mapping)

    # One host sync for all per-sequence lengths, instead of one per sequence (and one per forward call, not
    # per layer, inside `lengths_read_once`).
    starts, lens = _host_lengths(query_start_loc, seq_lens)
    _check_lengths(starts, lens, query.shape[0], key_cache.shape[1],
                   block_table.shape[1])
    if use_sdpa and alibi_slopes is None and _attend_fresh_on_flash(output, query, key, value, query_start_loc,
                                                                    starts, lens, scale):
        return

    attend = _attend_sdpa if use_sdpa else _attend_math
    block_size = key_cache.shape[1]
    single = []
    for b, seq_len in enumerate(lens):
        start, end = starts[b], starts[b + 1]
        if start == end:
            continue
        if use_sdpa and end - start == 1:
            single.append(b)
            continue
        n_blocks = -(-seq_len // block_size)
        blocks = block_table[b, :n_blocks].long()
        k = key_cache[blocks].flatten(0, 1)[:seq_len]
        v = value_cache[blocks].flatten(0, 1)[:seq_len]
        output[start:end] = attend(query[start:end], k, v, scale, alibi_slopes)
    if single:
        _decode_sdpa(output, query, key_cache, value_cache, block_table,
                     [starts[b] for b in single], single,
                     [lens[b] for b in single], scale, alibi_slopes)
    output[starts[-1]:].zero_()


# Within one forward call: (address, version, shape, strides, dtype) of query_start_loc and seq_lens -> the two
# tensors and their host copies. Holding the tensors keeps their memory from being handed to another tensor during
# the call (a length tensor a layer computes and frees, then another at the same address, must not hit).
_call_lengths: contextvars.ContextVar[dict | None] = contextvars.ContextVar("vgc_call_lengths", default=None)


def lengths_read_once(forward):
    """`forward` with its attention calls sharing one host read of each pair of length tensors per call.

    For the forwards vgc assembles from compiled pieces, whose pieces do not write their inputs: the lengths are
    the call's inputs, so between two layers of one call they change only by an in-place torch op, which bumps
    the tensor's version and so misses the memo."""
    @functools.wraps(forward)
    def call(*args, **kwargs):
        token = _call_lengths.set({})
        try:
            return forward(*args, **kwargs)
        finally:
            _call_lengths.reset(token)

    return call


def _read_lengths(query_start_loc, seq_lens):
    return query_start_loc.tolist(), seq_lens.tolist()


def _host_lengths(query_start_loc, seq_lens):
    memo = _call_lengths.get()
    if memo is None:
        return _read_lengths(query_start_loc, seq_lens)
    key = tuple((t.data_ptr(), t._version, t.shape, t.stride(), t.dtype) for t in (query_start_loc, seq_lens))
    found = memo.get(key)
    if found is None:
        found = memo[key] = (query_start_loc, seq_lens, _read_lengths(query_start_loc, seq_lens))
    return found[2]


_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_flash_refused: set = set()   # (device, dtype, head_dim) the flash kernel refused once: not tried again


def _attend_fresh_on_flash(output, query, key, value, query_start_loc, starts, lens, scale) -> bool:
    """A prefill of new sequences only (no cached context) in one flash varlen launch over the new K/V, in place
    of a gather and an SDPA call per sequence: prefill runs between piece graphs, where every launch costs host
    time. False (nothing done) for other batches, or where the kernel does not serve the dtype or head size."""
    if any(length != end - start for length, start, end in zip(lens, starts, starts[1:])):
        return False
    signature = (query.device, query.dtype, query.shape[2])
    if (query.dtype not in _FLASH_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype
            or signature in _flash_refused or starts[-1] == 0):
        return False
    total = starts[-1]
    cu = query_start_loc if query_start_loc.dtype == torch.int32 else query_start_loc.int()
    try:
        out = _compat.flash_varlen_forward(query[:total], key[:total], value[:total], cu, max(lens), scale,
                                           causal=True)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as error:   # an architecture, head size or layout the kernel does not take
        _flash_refused.add(signature)
        # on a GPU this costs every later prefill of new sequences its one-launch path: worth a warning (once)
        logger.log(logging.WARNING if query.is_cuda else logging.INFO,
                   "vgc::attention: flash varlen attention refused %s (%s); prefill attends per sequence",
                   signature, error)
        return False
    output[:total] = out
    output[total:].zero_()
    return True


def _decode_sdpa(output, query, key_cache, value_cache, block_table, rows,
                 seqs, lens, scale, alibi_slopes=None):
    """All single-token sequences in one SDPA call, keys padded to the
    longest context: decode batches are many short sequences, where a
    per-sequence loop is dominated by launch overhead."""
    device, block_size = query.device, key_cache.shape[1]
    max_len = max(lens)
    n_blocks = -(-max_len // block_size)
    rows = torch.tensor(rows, device=device)
    lens = torch.tensor(lens, device=device)
    blocks = block_table[torch.tensor(seqs, device=device), :n_blocks].long()
    # block_table entries past a sequence's last block may be anything.
    needed = torch.arange(n_blocks, device=device) * block_size < lens[:, None]
    blocks = blocks.where(needed, 0)
    valid = torch.arange(max_len, device=device) < lens[:, None]  # [B, S]
    # Zero padded keys/values: the cache there may hold NaN (torch.empty),
    # and a masked NaN still poisons softmax and the weighted sum.
    kv_mask = valid[:, :, None, None]
    k = key_cache[blocks].flatten(1, 2)[:, :max_len].where(kv_mask, 0)
    v = value_cache[blocks].flatten(1, 2)[:, :max_len].where(kv_mask, 0)
    q = query[rows].unsqueeze(2)                                 # [B, Hq, 1, D]
    mask = valid[:, None, None, :]
    if alibi_slopes is not None:   # each row's one query sits at its last position
        distance = torch.arange(max_len, device=device) - (lens[:, None] - 1)           # [B, S]
        mask = _alibi_mask(alibi_slopes, distance[:, None, None, :], mask, q.dtype)
    out = _sdpa(q, k.transpose(1, 2), v.transpose(1, 2), mask, False, scale)
    output[rows] = out.squeeze(2).to(output.dtype)


# Inside a graph, a batch of more tokens than sequences attends over keys gathered per token to the block table's
# width: fine for the few tokens per sequence of speculative decoding, a memory hazard for prefill.
_MAX_TOKENS_PER_SEQUENCE_IN_GRAPH = 16


def _attend_on_device(output, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale,
                      alibi_slopes=None):
    """Every token against its own sequence's cached keys, with no host sync (a CUDA graph can hold it): each
    token finds its sequence in `query_start_loc` on the device and attends the positions up to its own, over
    keys gathered to the block table's full width. Memory grows with tokens x that width: for the few tokens
    per sequence of a speculative-decoding step, not for prefill. Tokens past the last sequence (padding) get 0."""
    num_tokens, block_size = query.shape[0], key_cache.shape[1]
    device = query.device
    token = torch.arange(num_tokens, device=device)
    ends = query_start_loc[1:].long()
    seq = torch.searchsorted(ends, token, right=True).clamp(max=seq_lens.shape[0] - 1)
    real = token < query_start_loc[-1]
    lens = seq_lens.long()[seq]
    position = lens - (ends[seq] - token)                       # this token's position in its sequence
    width = block_table.shape[1]
    needed = torch.arange(width, device=device) * block_size < lens[:, None]
    blocks = block_table.long()[seq].where(needed, 0)           # entries past a sequence's last block: anything
    keys = torch.arange(width * block_size, device=device)
    visible = (keys[None, :] <= position[:, None]) & real[:, None]                  # [T, L]
    kv_mask = visible[:, :, None, None]
    k = key_cache[blocks].flatten(1, 2).where(kv_mask, 0)       # zeros: the cache may hold NaN past a sequence
    v = value_cache[blocks].flatten(1, 2).where(kv_mask, 0)
    visible = visible | ~real[:, None]                          # padding attends something, then is zeroed
    mask = visible[:, None, None, :]
    if alibi_slopes is not None:
        distance = keys[None, :] - position[:, None]                                    # [T, L]
        mask = _alibi_mask(alibi_slopes, distance[:, None, None, :], mask, query.dtype)
    out = _sdpa(query.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), mask, False, scale)
    output.copy_(out.squeeze(2).where(real[:, None, None], 0).to(output.dtype))


def _write_kv(key, value, key_cache, value_cache, slot_mapping):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block_size = key_cache.shape[1]
    # Index (block, offset) rather than a flattened view so that writes land
    # in the caller's storage even if the cache is non-contiguous.
    blk, off = slots // block_size, slots % block_size
    key_cache[blk, off] = key[valid].to(key_cache.dtype)
    value_cache[blk, off] = value[valid].to(value_cache.dtype)


def _key_distance(q_len: int, seq_len: int, device) -> torch.Tensor:
    """[q_len, seq_len]: key position minus query position, the new tokens being the last q_len positions."""
    positions = torch.arange(seq_len, device=device)
    return positions[None, :] - positions[seq_len - q_len:, None]


def _causal_mask(q_len: int, seq_len: int, device) -> torch.Tensor:
    # True = attend: keys at or before the query
    return _key_distance(q_len, seq_len, device) <= 0


def _alibi_mask(slopes, distance, visible, dtype):
    """SDPA's additive mask for ALiBi: slope[h] * (key position - query position) where `visible`, -inf elsewhere.
    `distance` broadcasts against [..., heads, queries, keys] with the heads dim of size 1."""
    bias = slopes.float().view(-1, 1, 1) * distance.float()
    return bias.masked_fill(~visible, float("-inf")).to(dtype)


def _attend_math(q, k, v, scale, alibi_slopes=None):
    """q [n, Hq, D], k/v [s, Hkv, D] -> [n, Hq, D]; fp32 internally."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    # Query head h reads kv head h // group, matching repeat_interleave.
    group = num_heads // num_kv_heads
    qg = q.float().reshape(n, num_kv_heads, group, head_dim)
    scores = torch.einsum("nhgd,shd->hgns", qg, k.float()) * scale
    seq_len = k.shape[0]
    if alibi_slopes is not None:
        bias = alibi_slopes.float().view(num_heads, 1, 1) * _key_distance(n, seq_len, q.device)
        scores = scores + bias.view(num_kv_heads, group, n, seq_len)
    mask = _causal_mask(n, seq_len, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.einsum("hgns,shd->nhgd", scores.softmax(dim=-1), v.float())
    return out.reshape(n, num_heads, head_dim).to(q.dtype)


def _attend_sdpa(q, k, v, scale, alibi_slopes=None):
    """Same contract as _attend_math, via scaled_dot_product_attention."""
    n, seq_len = q.shape[0], k.shape[0]
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    if alibi_slopes is not None:
        distance = _key_distance(n, seq_len, q.device)
        mask = _alibi_mask(alibi_slopes, distance, distance <= 0, q.dtype)
        return _sdpa(q4, k4, v4, mask[None], False, scale)[0].transpose(0, 1)
    mask, causal = None, False
    # SDPA's is_causal aligns the mask top-left, which is only right when the
    # queries cover the whole sequence; a lone last query needs no mask.
    if n == seq_len:
        causal = n > 1
    elif n > 1:
        mask = _causal_mask(n, seq_len, q.device)
    out = _sdpa(q4, k4, v4, mask, causal, scale)
    return out[0].transpose(0, 1)


def _sdpa(q, k, v, mask, causal, scale):
    """SDPA over [B, H, L, D] with grouped K/V heads (enable_gqa: no repeated K/V is materialised)."""
    k, v = k.to(q.dtype), v.to(q.dtype)
    return sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)


def _check_args(output, query, key, value, key_cache, value_cache,
                slot_mapping, block_table, seq_lens, query_start_loc):
    # The op runs eagerly between CUDA graphs on every layer of every step: one cheap test of everything
    # first, and the per-argument diagnosis only when it fails.
    q, k, cache, device = query.shape, key.shape, key_cache.shape, query.device
    if (len(q) == 3 and output.shape == q and len(k) == 3 and value.shape == k and k[0] == q[0]
            and k[2] == q[2] and k[1] > 0 and q[1] % k[1] == 0 and len(cache) == 4 and cache[2:] == k[1:]
            and value_cache.shape == cache and slot_mapping.dim() == 1 and slot_mapping.shape[0] == q[0]
            and block_table.dim() == 2 and seq_lens.dim() == 1 and block_table.shape[0] == seq_lens.shape[0]
            and query_start_loc.dim() == 1 and query_start_loc.shape[0] == seq_lens.shape[0] + 1
            and query.is_floating_point() and key.is_floating_point() and value.is_floating_point()
            and output.is_floating_point() and key_cache.is_floating_point() and value_cache.is_floating_point()
            and slot_mapping.dtype in _INDEX_DTYPES and block_table.dtype in _INDEX_DTYPES
            and seq_lens.dtype in _INDEX_DTYPES and query_start_loc.dtype in _INDEX_DTYPES
            and all(t.device == device for t in (output, key, value, key_cache, value_cache, slot_mapping,
                                                 block_table, seq_lens, query_start_loc))):
        return
    _explain_bad_args(output, query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens,
                      query_start_loc)


def _explain_bad_args(output, query, key, value, key_cache, value_cache,
                      slot_mapping, block_table, seq_lens, query_start_loc):
    def fail(name, msg):
        raise ValueError(f"vgc::attention: {name} {msg}")

    def want_rank(name, t, rank):
        if t.dim() != rank:
            fail(name, f"must be {rank}-D, got shape {tuple(t.shape)}")

    for name, t, rank in (("query", query, 3), ("key", key, 3),
                          ("value", value, 3), ("output", output, 3),
                          ("key_cache", key_cache, 4),
                          ("value_cache", value_cache, 4),
                          ("slot_mapping", slot_mapping, 1),
                          ("block_table", block_table, 2),
                          ("seq_lens", seq_lens, 1),
                          ("query_start_loc", query_start_loc, 1)):
        want_rank(name, t, rank)
        if t.device != query.device:
            fail(name, f"is on {t.device}, but query is on {query.device}")

    num_tokens, num_heads, head_dim = query.shape
    if output.shape != query.shape:
        fail("output", f"shape {tuple(output.shape)} != query shape "
                       f"{tuple(query.shape)}")
    if key.shape[0] != num_tokens or key.shape[2] != head_dim:
        fail("key", f"shape {tuple(key.shape)} does not match query "
                    f"[{num_tokens}, *, {head_dim}]")
    num_kv_heads = key.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        fail("key", f"has {num_kv_heads} heads, which must divide the "
                    f"{num_heads} query heads")
    if value.shape != key.shape:
        fail("value", f"shape {tuple(value.shape)} != key shape "
                      f"{tuple(key.shape)}")
    if key_cache.shape[2:] != key.shape[1:]:
        fail("key_cache", f"shape {tuple(key_cache.shape)} must be "
                          f"[num_blocks, block_size, {num_kv_heads}, {head_dim}]")
    if value_cache.shape != key_cache.shape:
        fail("value_cache", f"shape {tuple(value_cache.shape)} != key_cache "
                            f"shape {tuple(key_cache.shape)}")
    for name, t in (("query", query), ("key", key), ("value", value),
                    ("output", output), ("key_cache", key_cache),
                    ("value_cache", value_cache)):
        if not t.is_floating_point():
            fail(name, f"must be floating point, got {t.dtype}")
    for name, t in (("slot_mapping", slot_mapping),
                    ("block_table", block_table), ("seq_lens", seq_lens),
                    ("query_start_loc", query_start_loc)):
        if t.dtype not in _INDEX_DTYPES:
            fail(name, f"must be int32 or int64, got {t.dtype}")
    if slot_mapping.shape[0] != num_tokens:
        fail("slot_mapping", f"has {slot_mapping.shape[0]} entries for "
                             f"{num_tokens} tokens")
    num_seqs = seq_lens.shape[0]
    if block_table.shape[0] != num_seqs:
        fail("block_table", f"has {block_table.shape[0]} rows for "
                            f"{num_seqs} sequences")
    if query_start_loc.shape[0] != num_seqs + 1:
        fail("query_start_loc", f"has {query_start_loc.shape[0]} entries, "
                                f"expected num_seqs + 1 = {num_seqs + 1}")


def _check_slopes(alibi_slopes, query):
    if alibi_slopes.shape != (query.shape[1],) or not alibi_slopes.is_floating_point() or \
            alibi_slopes.device != query.device:
        raise ValueError(f"vgc::attention: alibi_slopes must be a floating-point tensor of one slope per query head "
                         f"([{query.shape[1]}]) on {query.device}, got {alibi_slopes.dtype} "
                         f"{tuple(alibi_slopes.shape)} on {alibi_slopes.device}")


def _check_lengths(starts, lens, num_tokens, block_size, max_blocks):
    if starts[0] != 0 or starts[-1] > num_tokens:
        raise ValueError(f"vgc::attention: query_start_loc must start at 0 and "
                         f"end at most at {num_tokens}, got {starts}")
    for b, seq_len in enumerate(lens):
        q_len = starts[b + 1] - starts[b]
        if q_len < 0 or q_len > seq_len:
            raise ValueError(
                f"vgc::attention: sequence {b} has {q_len} new tokens "
                f"(query_start_loc) but seq_lens[{b}] = {seq_len}")
        if -(-seq_len // block_size) > max_blocks:
            raise ValueError(
                f"vgc::attention: seq_lens[{b}] = {seq_len} needs more than "
                f"the {max_blocks} blocks of a block_table row")


def reference_attention(query, key, value, key_cache, value_cache,
                        slot_mapping, block_table, seq_lens, query_start_loc,
                        scale, alibi_slopes=None):
    """Slow, obviously-correct model of ``vgc::attention`` for tests.

    Leaves its inputs untouched; returns ``(output, key_cache, value_cache)``
    as new tensors. Works token by token and in float64 so that it shares no
    code path (gather, masking, GQA grouping) with the op.
    """
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            key_cache[slot // block_size, slot % block_size] = key[t]
            value_cache[slot // block_size, slot % block_size] = value[t]

    num_heads, num_kv_heads = query.shape[1], key.shape[1]
    kv_head = torch.arange(num_heads, device=query.device) // (
        num_heads // num_kv_heads)
    output = torch.zeros_like(query)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        rows = range(starts[b], starts[b + 1])
        if not rows:
            continue
        # Dense per-sequence K/V, one position at a time via the block table.
        cells = [(int(block_table[b, p // block_size]), p % block_size)
                 for p in range(seq_len)]
        k = torch.stack([key_cache[i, j] for i, j in cells]).double()
        v = torch.stack([value_cache[i, j] for i, j in cells]).double()
        k, v = k[:, kv_head], v[:, kv_head]                 # [s, Hq, D]
        q = query[starts[b]:starts[b + 1]].double()         # [n, Hq, D]
        scores = torch.einsum("nhd,shd->hns", q, k) * scale
        first_pos = seq_len - len(rows)
        if alibi_slopes is not None:   # ALiBi: slope * (key position - query position)
            for i in range(len(rows)):
                for p in range(seq_len):
                    scores[:, i, p] += alibi_slopes.double() * (p - (first_pos + i))
        mask = torch.zeros(len(rows), seq_len, dtype=torch.bool,
                           device=query.device)
        for i in range(len(rows)):
            mask[i, first_pos + i + 1:] = True              # future keys
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        output[starts[b]:starts[b + 1]] = torch.einsum(
            "hns,shd->nhd", probs, v).to(query.dtype)
    return output, key_cache, value_cache
