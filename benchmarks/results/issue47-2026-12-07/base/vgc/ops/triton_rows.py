"""Row-wise Triton kernels for the many-row side of the fused skinny matmuls: RMSNorm (after a residual add, or not),
SiLU-and-multiply and the rotary embedding.

When the fused decode matmul gets more rows than its one-row kernel takes (a prefill through the same
symbolic-size piece), it runs the neighbours it absorbed as separate launches again: these two, each one launch
like the Inductor kernel it replaced, around cuBLAS's product. Each rounds where the unfused graph rounds
(`h = bf16(x + r)`; `bf16(bf16(h * rstd) * w)`; `bf16(bf16(silu(g)) * u)`).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: torch's own ops
    triton = None

from vgc.ops.triton_launch import FastLauncher

HAS_TRITON = triton is not None


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    h = x + residual
    return h, rms_norm_reference(h, weight, eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope_table_offset(table, head_dim: int) -> int:
    """Where, in elements from a row's value d, a rotation table holds the value for column d + head_dim / 2 of a
    head: the same value (0) in a half-width table (vgc's Llama), the second half's in a full-width one
    (transformers' `cat((freqs, freqs))`, whose halves the graph cannot be shown to be equal)."""
    width = table.shape[-1]
    if width == head_dim // 2:
        return 0
    if width == head_dim:
        return head_dim // 2 * table.stride(-1)
    raise ValueError(f"a rotation table of {width} values per row for heads of {head_dim}: it must hold "
                     f"{head_dim // 2} (the half each pair shares) or {head_dim} (one per column)")


def rope_reference(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, columns: int, head_dim: int):
    """`y` with the rotary embedding (NeoX halves) on its first `columns` columns, heads of `head_dim`; `cos` and
    `sin` hold each row's `head_dim / 2` values (shared by both halves of a head) or `head_dim` values (one per
    column, as transformers' `q * cos + rotate_half(q) * sin`)."""
    half = head_dim // 2
    second_half = half if rope_table_offset(cos, head_dim) else 0
    heads = y[:, :columns].float().unflatten(-1, (-1, head_dim))
    first, second = heads[..., :half], heads[..., half:]
    c1, s1 = (t[:, :half].float().unsqueeze(1) for t in (cos, sin))
    c2, s2 = (t[:, second_half:second_half + half].float().unsqueeze(1) for t in (cos, sin))
    rotated = torch.cat((first * c1 - second * s1, second * c2 + first * s2), dim=-1).flatten(1).to(y.dtype)
    return torch.cat((rotated, y[:, columns:]), dim=-1)


def silu_mul_reference(y: torch.Tensor) -> torch.Tensor:
    gate, up = y.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


if HAS_TRITON:

    @triton.jit
    def _rms_norm_kernel(x, residual, h, w, out, K, stride_xm, stride_rm, stride_hm, stride_om, eps,
                         BLOCK: tl.constexpr, ADD: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        v = tl.load(x + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        if ADD:
            v = (v + tl.load(residual + row * stride_rm + cols, mask=mask, other=0.0).to(tl.float32))
            v = v.to(h.dtype.element_ty)
            tl.store(h + row * stride_hm + cols, v, mask=mask)
            v = v.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(v * v, axis=0) / K + eps)
        y = (v * rstd).to(out.dtype.element_ty).to(tl.float32) * tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + row * stride_om + cols, y.to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(y, out, N, stride_ym, stride_om, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        gate = tl.load(y + row * stride_ym + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(y + row * stride_ym + N + cols, mask=mask, other=0.0).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(out.dtype.element_ty).to(tl.float32)
        tl.store(out + row * stride_om + cols, (silu * up).to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_kernel(y, cos, sin, pairs, stride_ym, stride_cm, stride_cd, second_half, HALF: tl.constexpr,
                     BLOCK: tl.constexpr):
        row = tl.program_id(0)
        pair = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = pair < pairs
        d = pair % HALF
        col = (pair // HALF) * (2 * HALF) + d
        first = tl.load(y + row * stride_ym + col, mask=mask, other=0.0).to(tl.float32)
        second = tl.load(y + row * stride_ym + col + HALF, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos + row * stride_cm + d * stride_cd, mask=mask, other=1.0).to(tl.float32)
        s = tl.load(sin + row * stride_cm + d * stride_cd, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos + row * stride_cm + d * stride_cd + second_half, mask=mask, other=1.0).to(tl.float32)
        s2 = tl.load(sin + row * stride_cm + d * stride_cd + second_half, mask=mask, other=0.0).to(tl.float32)
        tl.store(y + row * stride_ym + col, (first * c - second * s).to(y.dtype.element_ty), mask=mask)
        tl.store(y + row * stride_ym + col + HALF, (second * c2 + first * s2).to(y.dtype.element_ty), mask=mask)

    _launch_rms_norm = FastLauncher(_rms_norm_kernel)
    _launch_rope = FastLauncher(_rope_kernel)
    _launch_silu_mul = FastLauncher(_silu_mul_kernel)


def _on_triton(t: torch.Tensor) -> bool:
    return HAS_TRITON and t.is_cuda and t.stride(-1) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of the 2-D `x`, scaled by `weight`."""
    return _rms_norm(x, None, weight, eps)[1]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(`h = x + residual`, RMSNorm of each row of `h` scaled by `weight`), in one launch; 2-D `x`."""
    return _rms_norm(x, residual, weight, eps)


def _rms_norm(x, residual, weight, eps):
    if not _on_triton(x) or x.shape[1] > 32768 or (residual is not None and not _on_triton(residual)):
        return (None, rms_norm_reference(x, weight, eps)) if residual is None else \
            add_rms_norm_reference(x, residual, weight, eps)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = None if residual is None else torch.empty_like(out)
    if x.shape[0]:
        block = triton.next_power_of_2(x.shape[1])
        _launch_rms_norm((x.shape[0],), (x, x if residual is None else residual, out if h is None else h,
                                         weight.contiguous(), out),
                         (x.shape[1], x.stride(0), 0 if residual is None else residual.stride(0),
                          out.stride(0), out.stride(0), eps),
                         BLOCK=block, ADD=residual is not None, num_warps=min(16, max(1, block // 512)))
    return h, out


def silu_mul(y: torch.Tensor) -> torch.Tensor:
    """`silu(y[:, :n]) * y[:, n:]` for the 2-D `y` of `2n` columns."""
    if not _on_triton(y):
        return silu_mul_reference(y)
    n = y.shape[1] // 2
    out = y.new_empty((y.shape[0], n))
    if y.shape[0] and n:
        _launch_silu_mul((y.shape[0], triton.cdiv(n, 1024)), (y, out), (n, y.stride(0), out.stride(0)),
                         BLOCK=1024, num_warps=4)
    return out


def rope_(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, columns: int, head_dim: int) -> torch.Tensor:
    """`rope_reference`, in place on `y` (2-D, contiguous rows) where Triton runs; returns the result."""
    if not _on_triton(y) or cos.stride(-1) != sin.stride(-1) or cos.stride(0) != sin.stride(0):
        return rope_reference(y, cos, sin, columns, head_dim)
    pairs = columns // 2
    if y.shape[0] and pairs:
        _launch_rope((y.shape[0], triton.cdiv(pairs, 512)), (y, cos, sin),
                     (pairs, y.stride(0), cos.stride(0), cos.stride(-1), rope_table_offset(cos, head_dim)),
                     HALF=head_dim // 2, BLOCK=512, num_warps=4)
    return y
