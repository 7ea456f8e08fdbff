"""`scaled_dot_product_attention` as vgc's attention ops call it: on a GPU, without cuDNN's attention.

cuDNN's attention is SDPA's first choice on Hopper, and it builds an execution plan for every new shape: on the
H200 (torch 2.11), 63-68 ms of host time for a decode step's attention at a KV length it had not seen, against
0.18 ms for `causal_attention` on SDPA's memory-efficient kernel (`benchmarks/device/sdpa_decode_backends.py`). A
server meets new shapes all the time (every prompt length, every step of a dynamic KV cache), and so does capture at
each size. llama_1b under generate(), each prompt a new length, with cuDNN allowed and without: breakable graphs
105 -> 35 ms to the first token and 64 -> 4.8 ms per token, vgc's Inductor integration 84 -> 24 ms and 4.25 -> 3.06
(`benchmarks/device/fresh_lengths.py`). A user's own SDPA calls keep SDPA's choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# False: SDPA's own choice, cuDNN included. Only cuDNN is switched off, and only for the call: the user's other
# backend settings stand (two flag calls, ~0.3 µs, where `torch.nn.attention.sdpa_kernel` costs ~12 µs a call)
AVOID_CUDNN = True
_flags = torch.backends.cuda


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options) -> torch.Tensor:
    """`F.scaled_dot_product_attention(query, key, value, **options)`, on a GPU without cuDNN's attention."""
    if not (AVOID_CUDNN and query.is_cuda and _flags.cudnn_sdp_enabled()):
        return F.scaled_dot_product_attention(query, key, value, **options)
    _flags.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(query, key, value, **options)
    finally:
        _flags.enable_cudnn_sdp(True)
