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


# What a one-row launch fuses around its product (the kernel's `EPILOGUE`).
PLAIN, ADD_RESIDUAL, SILU_MUL = 0, 1, 2


def choose_tile(m: int, n: int, k: int, norm: bool = False, epilogue: int = PLAIN) -> Tile:
    """The launch shape for an `[m, k] @ [k, n]` product, `m <= GEMV_MAX_M` (`n`: the weight's columns, so twice
    the output's under SILU_MUL): the sweep's where it measured one. Without a fused entry, a SILU_MUL launch takes
    the plain tile with half the output columns per program (each reads two weight rows per column)."""
    if norm or epilogue != PLAIN:
        tile = FUSED_TILES.get((n, k, norm, epilogue))
        if tile is not None:
            return tile
    block_m = _pow2(m)
    tile = GEMV_TILES.get((block_m, n, k)) or default_tile(block_m, n, k)
    if epilogue == SILU_MUL:
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

# One-row launches with neighbours fused, by (the weight's N, K, norm, epilogue); where none is measured, the plain
# tile (above) serves.
FUSED_TILES: dict[tuple[int, int, bool, int], Tile] = {}


if HAS_TRITON:

    @triton.jit
    def _gemv_kernel(a, b, c, norm_w, residual, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                     stride_cn, stride_rn, eps,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                     NORM: tl.constexpr, EPILOGUE: tl.constexpr):
        # One row (BLOCK_M == 1) may fuse its neighbours: NORM, the RMSNorm of `a` by `norm_w` (the row's scale
        # applied to the sums, so the loop is one pass over `a`); EPILOGUE 1, `+ residual`; EPILOGUE 2 (GATED),
        # `silu(gate) * up` of the product's two halves, each program taking gate column j and up column N + j
        # side by side (rows interleaved), so the pair meets in the same registers.
        GATED: tl.constexpr = EPILOGUE == 2
        ROWS: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
        pid = tl.program_id(0)
        i = tl.arange(0, ROWS)
        if GATED:
            rn = pid * BLOCK_N + i // 2
            w_row = rn + (i % 2) * N
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
            if BLOCK_M == 1:
                x = tl.load(a + (k0 + rk) * stride_ak, mask=k0 + rk < K, other=0.0).to(tl.float32)
                if NORM:
                    squares += x * x
                    x = x * tl.load(norm_w + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
            else:
                x = tl.load(a + rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak,
                            mask=(rm[:, None] < M) & (k0 + rk < K)[None, :], other=0.0).to(tl.float32)
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
            if EPILOGUE == 1:
                out = out.to(c.dtype.element_ty).to(tl.float32) + \
                    tl.load(residual + rn * stride_rn, mask=rn < N, other=0.0).to(tl.float32)
            tl.store(c + rn * stride_cn, out.to(c.dtype.element_ty), mask=rn < N)
        else:
            tl.store(c + rm[:, None] * stride_cm + rn[None, :] * stride_cn, tl.sum(acc, axis=2).to(c.dtype.element_ty),
                     mask=(rm[:, None] < M) & (rn[None, :] < N))

    _launch = FastLauncher(_gemv_kernel)


def skinny_mm_into(out, a, b, tile: Tile | None = None, pdl: bool = False, norm_weight=None, eps: float = 0.0,
                   epilogue: int = PLAIN, residual=None) -> None:
    """`out = a @ b` with the kernel (`a` has at most `GEMV_MAX_M` rows); `tile` overrides `choose_tile` (the sweep
    uses it); `pdl`: launched as a programmatic dependent of the kernel before it (Hopper and later, never under
    the interpreter).

    One row may fuse: `norm_weight` (with `eps`): `a` is RMS-normalised and scaled by it first; `epilogue`
    ADD_RESIDUAL: `out = a @ b + residual`; SILU_MUL: `out = silu(p[:, :n]) * p[:, n:]` for `p = a @ b` and `n`
    the columns of `out` (half of `b`'s).
    """
    m, k = a.shape
    n = out.shape[1]
    if m == 0:
        return
    fused = norm_weight is not None or epilogue != PLAIN
    assert not fused or m == 1, "fused neighbours take one row"
    assert b.shape[1] == (2 * n if epilogue == SILU_MUL else n), (tuple(b.shape), tuple(out.shape))
    tile = tile or choose_tile(m, b.shape[1], k, norm_weight is not None, epilogue)
    assert m <= tile.block_m <= GEMV_MAX_M, f"{m} rows in a tile of {tile.block_m}"
    residual = out if residual is None else residual
    _launch((triton.cdiv(n, tile.block_n),), (a, b, out, a if norm_weight is None else norm_weight, residual),
            (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
             residual.stride(-1), float(eps)),
            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, PDL=pdl,
            NORM=norm_weight is not None, EPILOGUE=epilogue,
            num_warps=tile.num_warps, num_stages=tile.num_stages, **({"launch_pdl": True} if pdl else {}))
