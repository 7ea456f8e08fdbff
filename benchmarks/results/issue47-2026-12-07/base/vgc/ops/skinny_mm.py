"""`vgc::skinny_mm(a, b)`: `a @ b` that reads `b` once when `a` has few rows (a decode step's matmuls).

A decode step's `[M, K] @ [K, N]` products, M a few rows, are bound by the bytes of the weights. The
`skinny_matmuls` graph pass (`vgc.passes.skinny_matmul`, on by default) puts this op in place of such `mm`s in every
compiled piece, and the op picks per call, from shapes alone (so also at CUDA-graph capture):

- CUDA, bf16/fp16, `b` K-contiguous (a weight's transpose) and `M <= MAX_M`: vgc's Triton kernel
  (`triton_skinny_mm`: CUDA-core multiply-adds), one launch, fp32 accumulation, launched as a programmatic
  dependent of the kernel before it on Hopper and later (`VGC_PDL=0`: not);
- anything else: `torch.mm`, exactly what the graph held before the pass.

Measured on an H200 (`benchmarks/sweep_skinny_mm.py`, benchmarks/results/issue47-2026-12-06/): at one row the kernel
beats cuBLAS on each of Llama-1B's projections (down: 10.4 against 13.4 µs; o: 4.2 against 6.1). The kernel takes up
to `triton_skinny_mm.GEMV_MAX_M` rows, but only one row has been measured faster than cuBLAS on a GPU (a tensor-core
variant lost from 2 rows on), so the op sends more than `MAX_M` rows to cuBLAS until a sweep says otherwise.

With `VGC_SKINNY_MM_ON_CPU=1` and `TRITON_INTERPRET=1` the kernel runs on CPU tensors (tests).
"""

from __future__ import annotations

import functools

import torch

from vgc import envs
from vgc.ops import triton_rows, triton_skinny_mm

__all__ = ["skinny_mm", "skinny_mm_fused", "skinny_mm_add_fused", "DTYPES", "MAX_M", "uses_kernel",
           "uses_fused_kernel"]

# The most rows the op sends to vgc's kernel: what was measured faster than cuBLAS (a batch-1 decode step).
MAX_M = 1
DTYPES = (torch.bfloat16, torch.float16)   # what the kernel multiplies (fp32 accumulation)


def _kernel_device(t: torch.Tensor) -> bool:
    if t.is_cuda:
        return True
    return t.device.type == "cpu" and envs.skinny_mm_on_cpu() and envs.triton_interpret()


def uses_kernel(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `skinny_mm(a, b)` runs vgc's kernel (else `torch.mm`)."""
    return (triton_skinny_mm.HAS_TRITON and 0 < a.shape[0] <= MAX_M and a.dtype in DTYPES
            and b.dtype == a.dtype and b.stride(0) == 1 and a.stride(1) == 1 and _kernel_device(a)
            and b.device == a.device)


@functools.cache
def _has_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9   # programmatic dependent launch: sm_90 on


def uses_pdl(a: torch.Tensor) -> bool:
    """Whether the kernel for `a` launches as a programmatic dependent of the kernel before it."""
    return a.is_cuda and envs.pdl() and _has_pdl(a.device.index if a.device.index is not None
                                                 else torch.cuda.current_device())


@torch.library.custom_op("vgc::skinny_mm", mutates_args=())
def skinny_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not uses_kernel(a, b):
        return torch.mm(a, b)
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    triton_skinny_mm.skinny_mm_into(out, a, b, pdl=uses_pdl(a))
    return out


@skinny_mm.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def uses_fused_kernel(a: torch.Tensor, b: torch.Tensor, norm_weight: torch.Tensor,
                      residual: torch.Tensor | None = None) -> bool:
    """Whether a fused skinny matmul runs as one launch of vgc's kernel (one row; else its parts run apart)."""
    return (a.shape[0] == 1 and uses_kernel(a, b) and norm_weight.dtype == a.dtype and norm_weight.is_contiguous()
            and norm_weight.device == a.device
            and (residual is None or (residual.dtype == a.dtype and residual.device == a.device)))


def _rope(cos, sin, rope_columns: int, head_dim: int):
    if cos is None:
        return None
    if cos.shape != sin.shape or cos.stride() != sin.stride():   # the kernels step through both alike
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, rope_columns, head_dim


def _parts(product: torch.Tensor, silu_mul: bool, rope) -> torch.Tensor:
    """The product's neighbours after it, as separate launches (more rows than the fused kernel takes)."""
    if silu_mul:
        return triton_rows.silu_mul(product)
    return product if rope is None else triton_rows.rope_(product, *rope)


@torch.library.custom_op("vgc::skinny_mm_fused", mutates_args=())
def skinny_mm_fused(a: torch.Tensor, b: torch.Tensor, norm_weight: torch.Tensor, eps: float, silu_mul: bool,
                    cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, rope_columns: int = 0,
                    head_dim: int = 0) -> torch.Tensor:
    """`(rms_norm(a) * norm_weight) @ b`, then `silu(p[:, :n]) * p[:, n:]` if `silu_mul` (n: half of b's columns),
    or, with `cos` and `sin`, the rotary embedding (NeoX halves) of the product's first `rope_columns` columns,
    heads of `head_dim` (q and k, before v): one row of `head_dim / 2` values per row of `a`, shared by both halves
    of a head (vgc's Llama), or of `head_dim` values, one per column (transformers' `q * cos + rotate_half(q) *
    sin`).

    One row: one launch of vgc's kernel. More rows: RMSNorm, SiLU-and-multiply and the rotation as vgc's row
    kernels on CUDA (torch's ops elsewhere) around `torch.mm`, each rounding where the unfused graph does."""
    rope = _rope(cos, sin, rope_columns, head_dim)
    n = b.shape[1] // 2 if silu_mul else b.shape[1]
    if uses_fused_kernel(a, b, norm_weight):
        out = torch.empty((1, n), dtype=a.dtype, device=a.device)
        triton_skinny_mm.skinny_mm_into(out, a, b, pdl=uses_pdl(a), norm_weight=norm_weight, eps=eps,
                                        gated=silu_mul, rope=rope)
        return out
    return _parts(torch.mm(triton_rows.rms_norm(a, norm_weight, eps), b), silu_mul, rope)


@skinny_mm_fused.register_fake
def _(a, b, norm_weight, eps, silu_mul, cos=None, sin=None, rope_columns=0, head_dim=0):
    return a.new_empty((a.shape[0], b.shape[1] // 2 if silu_mul else b.shape[1]))


@torch.library.custom_op("vgc::skinny_mm_add_fused", mutates_args=())
def skinny_mm_add_fused(a: torch.Tensor, residual: torch.Tensor, b: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float, silu_mul: bool, cos: torch.Tensor | None = None,
                        sin: torch.Tensor | None = None, rope_columns: int = 0,
                        head_dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`h = a + residual` and `skinny_mm_fused(h, b, norm_weight, eps, silu_mul, ...)`: a decoder layer's
    residual add, the RMSNorm after it and the matmul after that. Returns (h, product). More rows: the add and
    norm as one row kernel (as Inductor would fuse them), then the product."""
    rope = _rope(cos, sin, rope_columns, head_dim)
    n = b.shape[1] // 2 if silu_mul else b.shape[1]
    if uses_fused_kernel(a, b, norm_weight, residual):
        h = torch.empty_like(a, memory_format=torch.contiguous_format)
        out = torch.empty((1, n), dtype=a.dtype, device=a.device)
        triton_skinny_mm.skinny_mm_into(out, a, b, pdl=uses_pdl(a), norm_weight=norm_weight, eps=eps,
                                        gated=silu_mul, residual=residual, h=h, rope=rope)
        return h, out
    h, normed = triton_rows.add_rms_norm(a, residual, norm_weight, eps)
    return h, _parts(torch.mm(normed, b), silu_mul, rope)


@skinny_mm_add_fused.register_fake
def _(a, residual, b, norm_weight, eps, silu_mul, cos=None, sin=None, rope_columns=0, head_dim=0):
    return torch.empty_like(a, memory_format=torch.contiguous_format), \
        a.new_empty((a.shape[0], b.shape[1] // 2 if silu_mul else b.shape[1]))
