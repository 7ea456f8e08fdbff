"""The Triton kernel behind `vgc::skinny_mm`: `a @ b` for a few rows of `a`, at the speed of reading `b` once.

A decode step multiplies a handful of token rows by every weight matrix of the model, so its matmuls are bound by
the bytes of the weights, not by arithmetic. One program owns `BLOCK_N` output columns for every row of `a` (up to
`GEMV_MAX_M`): it streams its `[BLOCK_N, K]` slab of the weight exactly once, with fp32 multiply-adds on the CUDA
cores, the next tile's load issued before this one is used. Without tensor-core tiles `BLOCK_N` can be 1, so even a
narrow weight (down: 2048 rows of 8192) spreads over thousands of programs. With no split over K there is no
second pass and no workspace: one launch per matmul, safe in a CUDA graph. (A tensor-core variant that took up to
64 rows lost to cuBLAS from 2 rows on, on an H200: benchmarks/results/issue47-2026-12-06/sweep.txt.)

With `pdl=True` (Hopper and later) the kernel is launched as a programmatic dependent of the one before it: it
fetches its first weight tile, which no earlier kernel writes, while that kernel finishes, then waits on it
(`griddepcontrol.wait`) before it reads `a` or writes anything, and lets its own dependent launch early. A kernel
that waits before any other memory access is correct whatever comes before or after it.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the op uses torch.mm
    triton = None

from vgc.ops.triton_launch import FastLauncher
from vgc.ops.triton_rows import rope_table_offset

HAS_TRITON = triton is not None


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


GEMV_MAX_M = 8   # the most rows the kernel takes (fp32 accumulators for every row in registers)


def _pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def choose_tile(m: int, n: int, k: int, norm: bool = False, paired: bool = False) -> Tile:
    """The launch shape for an `[m, k] @ [k, n]` product, `m <= GEMV_MAX_M` (`n`: the weight's columns, twice the
    output's when gated): the sweep's where it measured one. Without a fused entry, a `paired` launch (gated or
    rotated: two weight rows per output pair) takes the plain tile with half the pairs per program."""
    if norm or paired:
        tile = FUSED_TILES.get((n, k, paired))
        if tile is not None:
            return tile
    block_m = _pow2(m)
    tile = GEMV_TILES.get((block_m, n, k)) or default_tile(block_m, n, k)
    if paired:
        tile = Tile(tile.block_m, max(1, tile.block_n // 2), tile.block_k, tile.num_warps, tile.num_stages)
    return tile


def default_tile(block_m: int, n: int, k: int) -> Tile:
    """The launch shape where no sweep measured one: enough programs to keep every SM streaming
    (several per SM even on a narrow weight), at most 32 fp32 accumulators per thread."""
    block_n = 1 if n <= 4096 or block_m > 1 else 4
    return Tile(block_m, block_n, max(16, min(512, _pow2(k))), num_warps=4, num_stages=1)


# The sweep's winners (`benchmarks/sweep_skinny_mm.py`, one NVIDIA H200, 2026-12-06,
# benchmarks/results/issue47-2026-12-06/sweep.txt), by (rows padded to a power of 2, N, K): Llama-1B's projections.
# Device time against cuBLAS at one row: qkv 5.22 vs 6.06 µs, o 4.19 vs 6.07, gate/up 18.19 vs 18.42, down 10.39
# vs 13.40.
GEMV_TILES: dict[tuple[int, int, int], Tile] = {
    (1, 3072, 2048): Tile(1, 1, 256, num_warps=2, num_stages=1),
    (1, 2048, 2048): Tile(1, 2, 1024, num_warps=4, num_stages=1),
    (1, 16384, 2048): Tile(1, 4, 256, num_warps=2, num_stages=1),
    (1, 2048, 8192): Tile(1, 1, 512, num_warps=4, num_stages=1),
}

# One-row launches with the RMSNorm fused before them, by (the weight's N, K, gated): the sweep's winners
# (`benchmarks/sweep_skinny_mm.py --fused`, one NVIDIA H100, 2026-12-06, benchmarks/results/issue47-2026-12-06b/run2):
# norm + qkv 6.70 µs (the plain launch 6.57), norm + gate/up + SiLU-and-multiply 24.50 (plain 24.23).
FUSED_TILES: dict[tuple[int, int, bool], Tile] = {
    (3072, 2048, False): Tile(1, 4, 512, num_warps=4, num_stages=1),
    (16384, 2048, True): Tile(1, 8, 128, num_warps=4, num_stages=1),
}


if HAS_TRITON:

    @triton.jit
    def _gemv_kernel(a, b, c, norm_w, residual, h, cos, sin, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, stride_rk, stride_cd, second_half, rot_cols, eps,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                     ADD: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, ROPE: tl.constexpr,
                     HALF: tl.constexpr):
        # One row (BLOCK_M == 1) may fuse its neighbours. ADD: the row is `a + residual` (rounded to a's dtype, as
        # the unfused graph holds it), which the first program also stores to `h`. NORM: the RMSNorm of the row by
        # `norm_w`, its scale applied to the sums (one pass over the row). GATED: `silu(gate) * up` of the
        # product's two halves, each program taking gate column j and up column N + j side by side (rows
        # interleaved), so the pair meets in the same registers. ROPE: rotary embedding of the first `rot_cols`
        # columns, heads of 2 * HALF: each program takes pairs of columns d and d + HALF of a head, output columns
        # where the product's are; column d turns by the row's `cos`/`sin` at d, column d + HALF by those at
        # d + `second_half` (0 for half-width tables, HALF's offset for full-width ones).
        PAIRED: tl.constexpr = GATED or ROPE
        ROWS: tl.constexpr = 2 * BLOCK_N if PAIRED else BLOCK_N
        pid = tl.program_id(0)
        i = tl.arange(0, ROWS)
        if GATED:
            rn = pid * BLOCK_N + i // 2
            w_row = rn + (i % 2) * N
        elif ROPE:   # rn: the pair; N counts pairs
            rn = pid * BLOCK_N + i // 2
            w_row = (rn // HALF) * (2 * HALF) + rn % HALF + (i % 2) * HALF
        else:
            rn = pid * BLOCK_N + i
            w_row = rn
        rk = tl.arange(0, BLOCK_K)
        rm = tl.arange(0, BLOCK_M)
        n_mask = rn[:, None] < N
        b_ptrs = b + w_row[:, None] * stride_bn + rk[None, :] * stride_bk   # [ROWS, BLOCK_K]: rows of the weight
        w = tl.load(b_ptrs, mask=n_mask & (rk[None, :] < K), other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if BLOCK_M == 1:
            acc = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
            squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, ROWS, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = k0 + rk < K
            if BLOCK_M == 1:
                x = tl.load(a + (k0 + rk) * stride_ak, mask=k_mask, other=0.0).to(tl.float32)
                if ADD:
                    x = (x + tl.load(residual + (k0 + rk) * stride_rk, mask=k_mask, other=0.0).to(tl.float32))
                    x = x.to(h.dtype.element_ty)
                    tl.store(h + k0 + rk, x, mask=k_mask & (pid == 0))
                    x = x.to(tl.float32)
                if NORM:
                    squares += x * x
                    x = x * tl.load(norm_w + k0 + rk, mask=k_mask, other=0.0).to(tl.float32)
            else:
                x = tl.load(a + rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak,
                            mask=(rm[:, None] < M) & k_mask[None, :], other=0.0).to(tl.float32)
            b_ptrs += BLOCK_K * stride_bk
            w_next = tl.load(b_ptrs, mask=n_mask & (rk[None, :] < K - k0 - BLOCK_K), other=0.0)
            if BLOCK_M == 1:
                acc += w.to(tl.float32) * x[None, :]
            else:
                acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
            w = w_next
        if BLOCK_M == 1:
            out = tl.sum(acc, axis=1)
            if NORM:
                out = out * tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
            if GATED:
                # Rounded where the unfused graph rounds: the product, then silu(gate), then the result.
                gate, up = tl.split(tl.reshape(out.to(c.dtype.element_ty).to(tl.float32), (BLOCK_N, 2)))
                silu = (gate / (1.0 + tl.exp(-gate))).to(c.dtype.element_ty).to(tl.float32)
                out = silu * up
                rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            if ROPE:
                # Rounded as the graph holds the product, rotated in fp32, rounded once
                first, second = tl.split(tl.reshape(out.to(c.dtype.element_ty).to(tl.float32), (BLOCK_N, 2)))
                pair = pid * BLOCK_N + tl.arange(0, BLOCK_N)
                d = pair % HALF
                col = (pair // HALF) * (2 * HALF) + d
                rotated = (col < rot_cols) & (pair < N)
                cos_d = tl.load(cos + d * stride_cd, mask=rotated, other=1.0).to(tl.float32)
                sin_d = tl.load(sin + d * stride_cd, mask=rotated, other=0.0).to(tl.float32)
                cos_h = tl.load(cos + d * stride_cd + second_half, mask=rotated, other=1.0).to(tl.float32)
                sin_h = tl.load(sin + d * stride_cd + second_half, mask=rotated, other=0.0).to(tl.float32)
                tl.store(c + col * stride_cn, (first * cos_d - second * sin_d).to(c.dtype.element_ty), mask=pair < N)
                tl.store(c + (col + HALF) * stride_cn, (second * cos_h + first * sin_h).to(c.dtype.element_ty),
                         mask=pair < N)
            else:
                tl.store(c + rn * stride_cn, out.to(c.dtype.element_ty), mask=rn < N)
        else:
            tl.store(c + rm[:, None] * stride_cm + rn[None, :] * stride_cn, tl.sum(acc, axis=2).to(c.dtype.element_ty),
                     mask=(rm[:, None] < M) & (rn[None, :] < N))

    _launch = FastLauncher(_gemv_kernel)


def skinny_mm_into(out, a, b, tile: Tile | None = None, pdl: bool = False, norm_weight=None, eps: float = 0.0,
                   gated: bool = False, residual=None, h=None, rope=None) -> None:
    """`out = a @ b` with the kernel (`a` has at most `GEMV_MAX_M` rows); `tile` overrides `choose_tile` (the sweep
    uses it); `pdl`: launched as a programmatic dependent of the kernel before it (Hopper and later, never under
    the interpreter).

    One row may fuse, in this order: `residual` (with `h`): the row is `a + residual`, also stored to `h`;
    `norm_weight` (with `eps`): the row is RMS-normalised and scaled by it; `gated`: `out = silu(p[:, :n]) *
    p[:, n:]` for the product `p` and `n` the columns of `out` (half of `b`'s); `rope` (cos, sin, rotated columns,
    head dim): the first columns of the product, heads of `head dim`, get the rotary embedding (NeoX halves) of
    the row's position, `cos` and `sin` its `head dim / 2` values, or `head dim` values whose second half turns
    the second half of each head (transformers' tables; `rope_table_offset`), any row stride.
    """
    m, k = a.shape
    n = out.shape[1]
    if m == 0:
        return
    fused = norm_weight is not None or gated or residual is not None or rope is not None
    assert not fused or m == 1, "fused neighbours take one row"
    assert (residual is None) == (h is None), "a residual needs `h` for the sum"
    assert not (gated and rope), "a product is gated or rotated, not both"
    assert b.shape[1] == (2 * n if gated else n), (tuple(b.shape), tuple(out.shape))
    tile = tile or choose_tile(m, b.shape[1], k, norm_weight is not None, gated or rope is not None)
    assert m <= tile.block_m <= GEMV_MAX_M, f"{m} rows in a tile of {tile.block_m}"
    cos, sin, rot_cols, head_dim = rope if rope is not None else (a, a, 0, 2)
    second_half = rope_table_offset(cos, head_dim) if rope is not None else 0
    columns = n // 2 if rope is not None else n   # a rotated product is launched by pairs of columns
    _launch((triton.cdiv(columns, tile.block_n),),
            (a, b, out, a if norm_weight is None else norm_weight, a if residual is None else residual,
             out if h is None else h, cos, sin),
            (m, columns, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
             1 if residual is None else residual.stride(-1), cos.stride(-1), second_half, rot_cols, float(eps)),
            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, PDL=pdl,
            ADD=residual is not None, NORM=norm_weight is not None, GATED=gated, ROPE=rope is not None,
            HALF=head_dim // 2,
            num_warps=tile.num_warps, num_stages=tile.num_stages, **({"launch_pdl": True} if pdl else {}))
