"""Triton kernels for the CUDA path of `vgc::attention`: KV-cache writes (before prefill attention) and
single-token decode, which writes the new K/V itself and attends in the same launch.

Both read every length from device memory and never synchronise with the host, so a decode step can be
captured in a CUDA graph (cudagraph_mode FULL) and replayed with new lengths and block tables.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the op uses its pure-torch path
    triton = None

from vgc import cuda_runtime  # module attribute: tests substitute stream_capturing
from vgc.ops.triton_launch import FastLauncher, uses_pdl

HAS_TRITON = triton is not None

if HAS_TRITON:

    @triton.jit
    def _write_kv_kernel(key, value, key_cache, value_cache, slot_mapping,
                         k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                         cache_stride_block, cache_stride_slot, cache_stride_h,
                         NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        token = tl.program_id(0)
        slot = tl.load(slot_mapping + token).to(tl.int64)
        if slot >= 0:  # a negative slot is a padding token: it writes nothing
            h = tl.arange(0, BLOCK_H)[:, None]
            d = tl.arange(0, BLOCK_D)[None, :]
            mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
            k = tl.load(key + token * k_stride_t + h * k_stride_h + d, mask=mask)
            v = tl.load(value + token * v_stride_t + h * v_stride_h + d, mask=mask)
            dst = (slot // BLOCK_SIZE) * cache_stride_block + (slot % BLOCK_SIZE) * cache_stride_slot \
                + h * cache_stride_h + d
            tl.store(key_cache + dst, k.to(key_cache.dtype.element_ty), mask=mask)
            tl.store(value_cache + dst, v.to(value_cache.dtype.element_ty), mask=mask)

    @triton.jit
    def _new_kv(key, value, key_cache, value_cache, slot_mapping, token, kv_head, write, k_stride_t, k_stride_h,
                v_stride_t, v_stride_h, cache_stride_block, cache_stride_slot, cache_stride_h, d, d_mask,
                BLOCK_SIZE: tl.constexpr):
        # The token's new K/V for one KV head, in the cache's dtype; stored to its slot by the program that
        # `write`s (one per KV head) unless the slot is negative (a padding token writes nothing).
        k_new = tl.load(key + token * k_stride_t + kv_head * k_stride_h + d, mask=d_mask, other=0.0)
        v_new = tl.load(value + token * v_stride_t + kv_head * v_stride_h + d, mask=d_mask, other=0.0)
        k_new = k_new.to(key_cache.dtype.element_ty)
        v_new = v_new.to(value_cache.dtype.element_ty)
        slot = tl.load(slot_mapping + token).to(tl.int64)
        if (slot >= 0) & write:
            dst = (slot // BLOCK_SIZE) * cache_stride_block + (slot % BLOCK_SIZE) * cache_stride_slot \
                + kv_head * cache_stride_h + d
            tl.store(key_cache + dst, k_new, mask=d_mask)
            tl.store(value_cache + dst, v_new, mask=d_mask)
        return k_new, v_new

    @triton.jit
    def _decode_kernel(output, query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens,
                       scale, q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                       o_stride_t, o_stride_h, bt_stride, cache_stride_block, cache_stride_slot, cache_stride_h,
                       num_seqs, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
        # One program per (token, query head); token t is sequence t's last position (uniform single-token
        # decode). The first head of each KV group writes the token's K/V to its slot; every head attends its
        # cached context plus the new K/V taken from registers, so writing and attending is one launch. It serves
        # fp32 caches; bf16/fp16 ones take the grouped kernel below (`_decode_variant`).
        token = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        k_new, v_new = _new_kv(key, value, key_cache, value_cache, slot_mapping, token, kv_head, head % GROUP == 0,
                               k_stride_t, k_stride_h, v_stride_t, v_stride_h, cache_stride_block, cache_stride_slot,
                               cache_stride_h, d, d_mask, BLOCK_SIZE)
        seq_len = tl.load(seq_lens + token, mask=token < num_seqs, other=0)
        q = tl.load(query + token * q_stride_t + head * q_stride_h + d, mask=d_mask, other=0.0).to(tl.float32)
        m = tl.full([1], float("-inf"), tl.float32)
        l = tl.zeros([1], tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for start in range(0, seq_len - 1, BLOCK_N):   # the cached context: every position but the last
            pos = start + tl.arange(0, BLOCK_N)
            pos_mask = pos < seq_len - 1
            block = tl.load(block_table + token * bt_stride + pos // BLOCK_SIZE, mask=pos_mask, other=0)
            row = block.to(tl.int64) * cache_stride_block + (pos % BLOCK_SIZE) * cache_stride_slot
            offs = row[:, None] + kv_head * cache_stride_h + d[None, :]
            kv_mask = pos_mask[:, None] & d_mask[None, :]
            k = tl.load(key_cache + offs, mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(value_cache + offs, mask=kv_mask, other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            s = tl.where(pos_mask, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        if seq_len > 0:   # the new token itself (a padding row of length 0 attends nothing)
            s_new = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
            m_new = tl.maximum(m, s_new)
            alpha = tl.exp(m - m_new)
            p_new = tl.exp(s_new - m_new)
            l = l * alpha + p_new
            acc = acc * alpha + p_new * v_new.to(tl.float32)
        out = tl.where(l > 0, acc / tl.maximum(l, 1e-30), 0.0)
        tl.store(output + token * o_stride_t + head * o_stride_h + d, out.to(output.dtype.element_ty),
                 mask=d_mask)

    @triton.jit
    def _decode_grouped_kernel(output, query, key, value, key_cache, value_cache, slot_mapping, block_table,
                               seq_lens, partials, arrivals, scale, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
                               v_stride_t, v_stride_h, o_stride_t, o_stride_h, bt_stride, cache_stride_block,
                               cache_stride_slot, cache_stride_h, num_seqs, GROUP: tl.constexpr,
                               BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, SPLITS: tl.constexpr,
                               PDL: tl.constexpr):
        # One program per (token, KV head): the GROUP query heads that share a KV head read its cached K/V once
        # (the per-head kernel reads them GROUP times) and are scored together on tensor cores, their rows padded
        # to BLOCK_G >= 16 (bf16/fp16 caches only: an fp32 dot would round to tf32). With SPLITS > 1 each of
        # SPLITS programs takes a slice of the context and writes its softmax state (max, sum, weighted values)
        # to `partials`, and the last of them to finish merges the SPLITS states (`arrivals` counts them): a few
        # sequences still occupy the GPU, in one launch.
        # PDL: launched as a programmatic dependent of the kernel before it (the q/k/v projection), which it waits
        # for before any memory access; its own dependent (the output projection) may then launch and fetch its
        # weights while this runs.
        token = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        g = tl.arange(0, BLOCK_G)
        g_mask = g < GROUP
        k_new, v_new = _new_kv(key, value, key_cache, value_cache, slot_mapping, token, kv_head, split == 0,
                               k_stride_t, k_stride_h, v_stride_t, v_stride_h, cache_stride_block, cache_stride_slot,
                               cache_stride_h, d, d_mask, BLOCK_SIZE)
        seq_len = tl.load(seq_lens + token, mask=token < num_seqs, other=0)
        context = tl.maximum(seq_len - 1, 0)   # the cached positions: every one but the last
        per_split = tl.cdiv(tl.cdiv(context, SPLITS), BLOCK_N) * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(lo + per_split, context)
        heads = kv_head * GROUP + g
        qd_mask = g_mask[:, None] & d_mask[None, :]
        q = tl.load(query + token * q_stride_t + heads[:, None] * q_stride_h + d[None, :], mask=qd_mask, other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pos_mask = pos < hi
            block = tl.load(block_table + token * bt_stride + pos // BLOCK_SIZE, mask=pos_mask, other=0)
            row = block.to(tl.int64) * cache_stride_block + (pos % BLOCK_SIZE) * cache_stride_slot
            offs = row[:, None] + kv_head * cache_stride_h + d[None, :]
            kv_mask = pos_mask[:, None] & d_mask[None, :]
            k = tl.load(key_cache + offs, mask=kv_mask, other=0.0)
            v = tl.load(value_cache + offs, mask=kv_mask, other=0.0)
            s = tl.dot(q.to(k.dtype), tl.trans(k)) * scale                              # [BLOCK_G, BLOCK_N]
            s = tl.where(pos_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        if (seq_len > 0) & (split == SPLITS - 1):   # the new token (a padding row of length 0 attends nothing)
            s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale
            m_new = tl.maximum(m, s_new)
            alpha = tl.exp(m - m_new)
            p_new = tl.exp(s_new - m_new)
            l = l * alpha + p_new
            acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
            m = m_new   # the state a split hands to the merge
        if SPLITS == 1:
            out = tl.where(l[:, None] > 0, acc / tl.maximum(l, 1e-30)[:, None], 0.0)
            tl.store(output + token * o_stride_t + heads[:, None] * o_stride_h + d[None, :],
                     out.to(output.dtype.element_ty), mask=qd_mask)
        else:   # partials: [tokens, kv heads, SPLITS, BLOCK_G, BLOCK_D + 2] fp32 (values, then max and sum)
            pair = token * tl.num_programs(1) + kv_head
            row = (pair * SPLITS + split) * BLOCK_G + g
            tl.store(partials + row[:, None] * (BLOCK_D + 2) + d[None, :], acc)
            tl.store(partials + row * (BLOCK_D + 2) + BLOCK_D, m)
            tl.store(partials + row * (BLOCK_D + 2) + BLOCK_D + 1, l)
            # Every thread's stores come before the count (the barrier), and the count releases them to the
            # GPU and acquires the other splits' stores for the program that arrives last. That program merges
            # and sets the count back to 0 for the next launch, so `arrivals` is 0 between launches and never
            # needs a reset of its own (a memset per launch would cost what the merge's launch cost).
            tl.debug_barrier()
            arrived = tl.atomic_add(arrivals + pair, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:
                tl.debug_barrier()
                _merge_splits(output, partials, pair, token, kv_head, o_stride_t, o_stride_h, d, g, GROUP,
                              HEAD_DIM, BLOCK_D, BLOCK_G, SPLITS)
                tl.atomic_xchg(arrivals + pair, 0, sem="relaxed", scope="gpu")

    @triton.jit
    def _merge_splits(output, partials, pair, token, kv_head, o_stride_t, o_stride_h, d, g, GROUP: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, SPLITS: tl.constexpr):
        # The SPLITS softmax states of one (token, KV head) merged into the output rows of its query heads. Read
        # past L1 (".cg"): other SMs wrote them, and this SM's L1 may hold the same addresses from an earlier
        # launch.
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for split in tl.static_range(SPLITS):
            row = (pair * SPLITS + split) * BLOCK_G + g
            part_acc = tl.load(partials + row[:, None] * (BLOCK_D + 2) + d[None, :], cache_modifier=".cg")
            part_m = tl.load(partials + row * (BLOCK_D + 2) + BLOCK_D, cache_modifier=".cg")
            part_l = tl.load(partials + row * (BLOCK_D + 2) + BLOCK_D + 1, cache_modifier=".cg")
            m_new = tl.maximum(m, part_m)
            base = tl.where(m_new == float("-inf"), 0.0, m_new)   # both empty: weights 0, not NaN
            alpha = tl.exp(m - base)
            beta = tl.exp(part_m - base)
            l = l * alpha + part_l * beta
            acc = acc * alpha[:, None] + part_acc * beta[:, None]
            m = m_new
        out = tl.where(l[:, None] > 0, acc / tl.maximum(l, 1e-30)[:, None], 0.0)
        heads = kv_head * GROUP + g
        tl.store(output + token * o_stride_t + heads[:, None] * o_stride_h + d[None, :],
                 out.to(output.dtype.element_ty), mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :])

    _launch_write_kv = FastLauncher(_write_kv_kernel)
    _launch_decode = FastLauncher(_decode_kernel)
    _launch_decode_grouped = FastLauncher(_decode_grouped_kernel)
    # Block sizes are derived on every launch between graphs; Triton's helper costs about 1 µs a call.
    _pow2 = functools.cache(triton.next_power_of_2)


def write_kv(key, value, key_cache, value_cache, slot_mapping) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    ks, vs, cs = key.stride(), value.stride(), key_cache.stride()
    assert ks[2] == vs[2] == cs[3] == 1, "head dim must be contiguous"
    assert cs == value_cache.stride(), "key and value caches must share one layout"
    _launch_write_kv(
        (num_tokens,),
        (key, value, key_cache, value_cache, slot_mapping),
        (ks[0], ks[1], vs[0], vs[1], cs[0], cs[1], cs[2]),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=key_cache.shape[1],
        BLOCK_H=_pow2(num_kv_heads), BLOCK_D=_pow2(head_dim))


def decode_attention(output, query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens,
                     scale: float, variant: tuple[str, int, int, int] | None = None) -> None:
    """Uniform decode in one launch: token t is sequence t's last position; its K/V go to its slot (none for a
    negative slot) and it attends its cached context plus itself. No host sync.

    Runs once per layer per step between piece graphs, so it reads each tensor's strides once (host time).
    `variant` forces a kernel as (kind, BLOCK_N, num_warps, SPLITS) (benchmarks, tests); by default `_decode_variant`
    picks one from the batch size and dtype, which inside a captured graph is fixed per capture size."""
    num_tokens, num_heads, head_dim = query.shape
    if num_tokens == 0:
        return
    qs, ks, vs, os_, cs = query.stride(), key.stride(), value.stride(), output.stride(), key_cache.stride()
    assert qs[2] == ks[2] == vs[2] == os_[2] == cs[3] == 1, "head dim must be contiguous"
    assert cs == value_cache.stride(), "key and value caches must share one layout"
    num_kv_heads = key.shape[1]
    group = num_heads // num_kv_heads
    tensors = (output, query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens)
    scalars = (scale, qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], os_[0], os_[1], block_table.stride(0), cs[0], cs[1],
               cs[2], seq_lens.shape[0])
    shape = dict(GROUP=group, BLOCK_SIZE=key_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=_pow2(head_dim))
    kind, block_n, warps, splits = variant or _decode_variant(num_tokens, num_kv_heads, head_dim, key_cache.dtype)
    if kind == "head" and splits != 1:
        raise ValueError("the per-query-head decode kernel does not split the context (SPLITS must be 1)")
    if kind == "head":
        _launch_decode((num_tokens, num_heads), tensors, scalars, **shape, BLOCK_N=block_n, num_warps=warps)
        return
    if kind != "grouped-dot":
        raise ValueError(f"decode kernel kind must be 'head' or 'grouped-dot', got {kind!r}")
    if key_cache.dtype not in _TENSOR_CORE_DTYPES:
        raise ValueError(f"the grouped decode kernel scores on tensor cores, which would round a {key_cache.dtype} "
                         "cache to tf32; use the 'head' kernel for it")
    # Tensor cores take 16-bit products of K >= 16 (Triton refuses a smaller one at compile time on NVIDIA GPUs):
    # a head of 8 or fewer elements is padded to 16, its extra columns masked.
    shape["BLOCK_D"] = max(16, shape["BLOCK_D"])
    block_g = max(16, _pow2(group))
    if splits == 1:
        partials = arrivals = output
    else:
        partials = torch.empty(num_tokens * num_kv_heads * splits * block_g * (shape["BLOCK_D"] + 2),
                               dtype=torch.float32, device=output.device)
        arrivals = _arrivals(key_cache, num_tokens * num_kv_heads)
    pdl = uses_pdl(query)
    _launch_decode_grouped((num_tokens, num_kv_heads, splits), (*tensors, partials, arrivals), scalars, **shape,
                           BLOCK_N=block_n, BLOCK_G=block_g, SPLITS=splits, PDL=pdl, num_warps=warps,
                           **({"launch_pdl": True} if pdl else {}))


# The split kernel's arrival counts, per KV cache: 0 between launches (the last program of each launch sets them
# back). One set per cache, because two launches on one set at once (two models' graphs replayed on two streams)
# would count each other's programs; launches on one cache are ordered anyway, as its writes must be.
_ARRIVALS: dict[tuple, torch.Tensor] = {}
# Every set ever made stays alive: a captured graph reads its address for good.
_KEPT: list[torch.Tensor] = []


def _arrivals(key_cache: torch.Tensor, count: int) -> torch.Tensor:
    key = (key_cache.device, key_cache.data_ptr())
    held = _ARRIVALS.get(key)
    if held is not None and held.numel() >= count:
        return held
    made = torch.zeros(max(count, _SPLIT_BELOW), dtype=torch.int32, device=key_cache.device)
    _KEPT.append(made)
    if cuda_runtime.stream_capturing():
        # Made in a capture, its zeroing is a step of that graph: it runs at each replay of it and not before, so
        # a graph that is never replayed (a capture undone) leaves it unwritten. The graph keeps it to itself.
        return made
    _ARRIVALS[key] = made
    return made


# Below this many programs (tokens x KV heads) the default splits the context; one arrival count per program
_SPLIT_BELOW = 128

# Caches the grouped kernel scores on tensor cores (an fp32 cache would be rounded to tf32 there).
_TENSOR_CORE_DTYPES = (torch.float16, torch.bfloat16)


def _decode_variant(num_tokens: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> tuple[str, int, int, int]:
    """(kernel, BLOCK_N, num_warps, SPLITS) for a decode launch of `num_tokens` tokens.

    Measured on the H200 (`benchmarks/sweep_decode_attention.py`, Llama-3.2-1B heads, bf16, device time per
    launch): a program per KV head scoring its 4 query heads on tensor cores with 64-key tiles took 3.4 / 5.6 /
    18 us at batch 1 / 64 / 256 with 2-30 cached tokens (a program per query head, 4 warps: 3.1 / 12 / 37) and
    11 / 24 us at batch 1 / 64 with 512 (22 / 120), 103 us at batch 1 with 4000 (260). Past 64 tokens 32-key
    tiles keep more programs resident (13 us at 256 with short contexts, 96 with 512). fp32 caches would round
    to tf32 on tensor cores: they keep a program per query head, one warp and 16-key tiles (2.5 / 5.3 / 12 us
    short, 2-3x faster than 4 warps at batch 64 and 256).

    Below 128 programs (tokens x KV heads) the context is split over 4 programs per KV head, merged by a second
    launch at the time of these numbers (since 2026-12-07 by the last of the 4 programs, in the same launch): at
    batch 1 a program per KV head leaves 8 programs for the whole GPU. At batch 1 that took 99 -> 30 us
    with 4000 cached tokens and 11.5 -> 6.4 with 512, and costs 1.6 us with 2-30 (3.4 -> 5.0: the merge's launch);
    16 programs took 14 us with 4000 but 7.7 with 2-30, so 4 is the default. Batch 8: 53 -> 21 us with 2048."""
    if dtype not in _TENSOR_CORE_DTYPES:
        return "head", 16, 1, 1
    splits = 4 if num_tokens * num_kv_heads < _SPLIT_BELOW else 1
    return "grouped-dot", 64 if num_tokens <= 64 and head_dim <= 128 else 32, 4, splits
