"""`scaled_dot_product_attention` as vgc's attention ops call it: on a GPU, without cuDNN's attention.

cuDNN's attention is SDPA's first choice on Hopper, and it builds an execution plan for every new shape: on the
H200 (torch 2.11), 63-68 ms of host time for a decode step's attention at a KV length it had not seen, against
0.17 ms for SDPA's flash or memory-efficient kernels (`benchmarks/device/sdpa_decode_backends.py`). A server meets
new shapes all the time (every prompt length, every step of a dynamic KV cache), and so does capture at each size;
llama_1b under generate() with fresh prompt lengths: 77.6 ms per token with cuDNN allowed, 6.9 without
(`benchmarks/device/breakable_fresh_lengths.py`). A user's own SDPA calls keep SDPA's choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

# None: SDPA's own choice (cuDNN included)
BACKENDS: list[SDPBackend] | None = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options) -> torch.Tensor:
    """`F.scaled_dot_product_attention(query, key, value, **options)` with `BACKENDS` on a GPU."""
    if BACKENDS is None or not query.is_cuda:
        return F.scaled_dot_product_attention(query, key, value, **options)
    with sdpa_kernel(BACKENDS):
        return F.scaled_dot_product_attention(query, key, value, **options)
