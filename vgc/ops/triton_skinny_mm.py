"""The Triton kernels behind `vgc::skinny_mm`: `a @ b` for a few rows of `a`, at the speed of reading `b` once.

A decode step multiplies a handful of token rows by every weight matrix of the model, so its matmuls are bound by
the bytes of the weights, not by arithmetic. One program owns `BLOCK_N` output columns for every row of `a`: it
streams its `[BLOCK_N, K]` slab of the weight exactly once. With no split over K there is no second pass and no
workspace: one launch per matmul, safe in a CUDA graph. Two kernels:

- one row (`_gemv_kernel`, a batch-1 decode step): fp32 multiply-adds on the CUDA cores over a `[BLOCK_N, BLOCK_K]`
  tile, the next tile's load issued before this one is used. Without tensor-core tiles `BLOCK_N` can be as small
  as 2, so even a narrow weight (down: 2048 rows of 8192) spreads over hundreds of programs;
- more rows (`_skinny_mm_kernel`): all of `a` times the slab on the tensor cores (rows past `M` are masked, so
  padding `a` to 16 rows costs no memory traffic), through a deep software pipeline.

With `pdl=True` (Hopper and later) a kernel is launched as a programmatic dependent of the one before it: it fetches
its first weight tile, which no earlier kernel writes, while that kernel finishes, then waits on it
(`griddepcontrol.wait`) before it reads `a` or writes anything, and lets its own dependent launch early. A kernel
that waits before any other memory access is correct whatever comes before or after it.

`b` is expected K-contiguous (a weight's transpose, as `F.linear` hands it to `mm`); `skinny_mm` checks that
before it calls here.
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


def choose_tile(m: int, n: int, k: int) -> Tile:
    """The launch shape for an `[m, k] @ [k, n]` product (`block_m == 1`: the one-row kernel)."""
    if m == 1:
        return _GEMV_TILES.get((n, k)) or gemv_tile(n, k)
    return dot_tile(m, n, k)


def gemv_tile(n: int, k: int) -> Tile:
    """The one-row kernel's launch shape: enough programs to keep every SM streaming (>= ~4 per SM on a narrow
    weight), wide enough loads that each thread has several 16-byte reads in flight."""
    block_n = 2 if n <= 2048 else 4 if n <= 8192 else 8
    block_k = min(1024, max(16, triton.next_power_of_2(k) if triton else k))
    return Tile(1, block_n, block_k, num_warps=4, num_stages=1)


# Measured winners per (n, k) for the one-row kernel, filled from a sweep on the GPU (benchmarks/sweep_skinny_mm.py).
_GEMV_TILES: dict[tuple[int, int], Tile] = {}


def dot_tile(m: int, n: int, k: int) -> Tile:
    """The tensor-core kernel's launch shape for `m > 1` rows: the winners of the H200 sweep over Llama-1B's projection
    shapes (`benchmarks/sweep_skinny_mm.py`, `benchmarks/results/skinny-mm-sweep-h200-2026-12-03.txt`): wide
    blocks and a shallow pipeline for a wide weight, narrow blocks and a deep pipeline for the others."""
    block_m = max(16, triton.next_power_of_2(m)) if triton else max(16, m)
    block_n = 64 if n >= 8192 else 32 if n > 2048 else 16
    block_k = min(256 if k >= 8192 else 128, max(16, triton.next_power_of_2(k) if triton else k))
    return Tile(block_m, block_n, block_k, num_warps=4, num_stages=3 if n >= 8192 else 5)


if HAS_TRITON:

    @triton.jit
    def _gemv_kernel(a, b, c, N, K, stride_ak, stride_bk, stride_bn, stride_cn,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        n_mask = rn[:, None] < N
        b_ptrs = b + rn[:, None] * stride_bn + rk[None, :] * stride_bk      # [BLOCK_N, BLOCK_K]: rows of the weight
        w = tl.load(b_ptrs, mask=n_mask & (rk[None, :] < K), other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(a + (k0 + rk) * stride_ak, mask=k0 + rk < K, other=0.0)
            b_ptrs += BLOCK_K * stride_bk
            w_next = tl.load(b_ptrs, mask=n_mask & (rk[None, :] < K - k0 - BLOCK_K), other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
            w = w_next
        tl.store(c + rn * stride_cn, tl.sum(acc, axis=1).to(c.dtype.element_ty), mask=rn < N)

    _launch_gemv = FastLauncher(_gemv_kernel)

    @triton.jit
    def _skinny_mm_kernel(a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr):
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a + rm[:, None] * stride_am + rk[None, :] * stride_ak      # [BLOCK_M, BLOCK_K]
        b_ptrs = b + rn[:, None] * stride_bn + rk[None, :] * stride_bk      # [BLOCK_N, BLOCK_K]: rows of the weight
        m_mask = rm[:, None] < M
        n_mask = rn[:, None] < N
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                a_tile = tl.load(a_ptrs, mask=m_mask, other=0.0)
                if EVEN_N:
                    b_tile = tl.load(b_ptrs)
                else:
                    b_tile = tl.load(b_ptrs, mask=n_mask, other=0.0)
            else:
                k_mask = rk[None, :] < K - k0
                a_tile = tl.load(a_ptrs, mask=m_mask & k_mask, other=0.0)
                b_tile = tl.load(b_ptrs, mask=n_mask & k_mask, other=0.0)
            acc = tl.dot(a_tile, tl.trans(b_tile), acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c.dtype.element_ty), mask=m_mask & (rn[None, :] < N))

    _launch = FastLauncher(_skinny_mm_kernel)


def skinny_mm_into(out, a, b, tile: Tile | None = None, pdl: bool = False) -> None:
    """`out = a @ b` with the kernels; `tile` overrides `choose_tile` (the sweep uses it); `pdl`: launched as a
    programmatic dependent of the kernel before it (Hopper and later, never under the interpreter)."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0:
        return
    tile = tile or choose_tile(m, n, k)
    options = {"launch_pdl": True} if pdl else {}
    if tile.block_m == 1 and m == 1:
        _launch_gemv((triton.cdiv(n, tile.block_n),), (a, b, out),
                     (n, k, a.stride(1), b.stride(0), b.stride(1), out.stride(1)),
                     BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, PDL=pdl,
                     num_warps=tile.num_warps, num_stages=tile.num_stages, **options)
        return
    block_m = max(16, tile.block_m)
    _launch((triton.cdiv(n, tile.block_n), triton.cdiv(m, block_m)), (a, b, out),
            (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1)),
            BLOCK_M=block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
            EVEN_N=n % tile.block_n == 0, EVEN_K=k % tile.block_k == 0, PDL=pdl,
            num_warps=tile.num_warps, num_stages=tile.num_stages, **options)
