"""`vgc::skinny_mm(a, b)`: `a @ b` that reads `b` once when `a` has few rows (a decode step's matmuls).

A decode step's `[M, K] @ [K, N]` products, M at most a few dozen, are bound by the bytes of the weights. The
`skinny_matmuls` graph pass (`vgc.passes.skinny_matmul`, off by default) puts this op in place of such `mm`s in every
compiled piece, and the op picks per call, from shapes alone (so also at CUDA-graph capture):

- CUDA, bf16/fp16, `b` K-contiguous (a weight's transpose) and `M <= MAX_M`: vgc's Triton kernels
  (`triton_skinny_mm`: CUDA-core multiply-adds for one row, tensor cores for more), one launch, fp32 accumulation,
  launched as a programmatic dependent of the kernel before it on Hopper and later (`VGC_PDL=0`: not);
- anything else: `torch.mm`, exactly what the graph held before the pass.

Measured on an H200 (`benchmarks/sweep_skinny_mm.py`, docs/benchmarks.md): cuBLAS is as fast on a wide weight
(gate/up: 3.74 TB/s against the kernel's best 3.78) and faster where it splits K (down: 2.6 against 2.0), so the
pass stays off; this op is where a split-K or weight-prefetching variant would go.

With `VGC_SKINNY_MM_ON_CPU=1` and `TRITON_INTERPRET=1` the kernel runs on CPU tensors (tests).
"""

from __future__ import annotations

import functools

import torch

from vgc import envs
from vgc.ops import triton_skinny_mm

__all__ = ["skinny_mm", "DTYPES", "MAX_M", "uses_kernel"]

# The most rows the kernel takes: it holds every row of `a` in one tile (the sweep measured it up to 64 rows).
MAX_M = 64
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
