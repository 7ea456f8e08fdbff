"""The flat batch: how a step of many sequences reaches vgc's attention ops, and how vgc pads it to a graph size.

Every sequence's new tokens are laid end to end in one token dimension (`input_ids`, `positions`, `slot_mapping`:
where each token's K/V goes in the paged cache), with per-sequence `seq_lens` (cached + new tokens), a
`block_table` and the cumulative new-token offsets `query_start_loc`. vgc's own Llama and the transformers
integration both speak it; this module says it once.
"""

from __future__ import annotations

__all__ = ["PAD_VALUES", "is_uniform_decode", "uniform_decode_of"]

# How vgc pads a flat batch up to a CUDA-graph capture size: padded tokens write no KV (slot -1) and padded
# sequences are empty (length 0, cumulative offsets repeated).
PAD_VALUES = {"input_ids": 0, "positions": 0, "slot_mapping": -1, "block_table": 0, "seq_lens": 0,
              "query_start_loc": "edge"}


def is_uniform_decode(batch: dict) -> bool:
    """One new token per sequence, read from shapes alone (no device sync): FULL CUDA graphs serve these."""
    return batch["input_ids"].shape[0] == batch["seq_lens"].shape[0]


def uniform_decode_of(query_len: int):
    """`is_uniform_decode` for `query_len` tokens per sequence (speculative decoding: 1 + k), from shapes alone.
    The batches the caller makes must keep that promise: a prefill of `query_len` tokens per sequence passes too."""
    def is_uniform(batch: dict) -> bool:
        return batch["input_ids"].shape[0] == query_len * batch["seq_lens"].shape[0]
    return is_uniform
