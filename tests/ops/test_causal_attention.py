"""`vgc::causal_attention` against attention written out per row and query in float64."""

import pytest
import torch

from vgc.ops import causal_attention  # noqa: F401  (registers torch.ops.vgc.causal_attention)
from vgc.ops.causal_attention import padding_bias


def written_out(query, key, value, padding_mask, scale, window=None):
    batch, heads, q, dim = query.shape
    kv, group = key.shape[2], heads // key.shape[1]
    out = torch.zeros(batch, q, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(q):
                allowed = [j for j in range(kv) if j <= kv - q + i and (padding_mask is None or padding_mask[b, j])
                           and (window is None or j > kv - q + i - window)]
                allowed = allowed or list(range(kv))   # a padding row attends to all (its output is unused)
                k, v = key[b, h // group, allowed].double(), value[b, h // group, allowed].double()
                weights = torch.softmax(k @ query[b, h, i].double() * scale, dim=0)
                out[b, i, h] = weights @ v
    return out


@pytest.mark.parametrize("q, kv, masked", [(1, 1, None), (1, 9, None), (1, 9, "2-D"), (1, 9, "bias"), (1, 21, "bias"),
                                           (5, 5, None), (5, 5, "2-D"), (5, 5, "bias"), (3, 11, "2-D")],
                         ids=["first", "decode", "decode-padded", "decode-bias", "decode-bias-long", "prefill",
                              "prefill-padded", "prefill-bias", "chunk-padded"])
def test_equals_attention_written_out(q, kv, masked):
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, q, 8), torch.randn(2, 2, kv, 8), torch.randn(2, 2, kv, 8)
    mask = None
    if masked:
        mask = torch.ones(2, kv, dtype=torch.long)
        mask[1, :2] = 0   # left padding
    given = padding_bias(mask, query.dtype) if masked == "bias" else mask
    got = torch.ops.vgc.causal_attention(query, key, value, given, 0.3, None)
    torch.testing.assert_close(got.double(), written_out(query, key, value, mask, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes, mask_shape, message", [
    (((1, 4, 1, 8), (1, 3, 4, 8)), None, "heads a multiple of kv_heads"),
    (((1, 4, 5, 8), (1, 2, 4, 8)), None, "the keys must include the queries' own"),
    (((1, 4, 1, 8), (1, 2, 4, 8)), (1, 3), r"padding_mask must be \[batch, kv\]"),
    (((4, 1, 8), (1, 2, 4, 8)), None, r"query must be \[batch, heads, q, dim\]"),
    (((1, 4, 1, 8), (1, 2, 4, 8)), (1, 4), r"additive bias in the queries' dtype torch.float32, got torch.float64"),
])
def test_bad_shapes_name_the_problem(shapes, mask_shape, message):
    (qs, ks) = shapes
    mask = torch.ones(mask_shape, dtype=torch.float64) if mask_shape else None
    with pytest.raises(ValueError, match=message):
        torch.ops.vgc.causal_attention(torch.randn(qs), torch.randn(ks), torch.randn(ks), mask, 1.0, None)


def test_padding_bias_rows_are_aligned_for_the_memory_efficient_kernel():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    bias = padding_bias(mask, torch.bfloat16)
    assert bias.dtype == torch.bfloat16 and bias.shape == (2, 3) and bias.stride() == (16, 1)
    assert bias.tolist() == [[float("-inf"), 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("q, kv, window, bias", [(1, 9, 4, False), (1, 9, 4, True), (1, 3, 4, False),
                                                 (7, 7, 3, False), (3, 11, 5, True)],
                         ids=["decode", "decode-bias", "decode-within", "prefill", "chunk-bias"])
def test_sliding_window_equals_attention_written_out(q, kv, window, bias):
    """Each query sees itself and the window - 1 keys before it (transformers' sliding_window), padding too."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, q, 8), torch.randn(2, 2, kv, 8), torch.randn(2, 2, kv, 8)
    mask = torch.ones(2, kv, dtype=torch.bool)
    mask[1, :2] = False
    given = padding_bias(mask, query.dtype) if bias else mask
    got = torch.ops.vgc.causal_attention(query, key, value, given, 0.3, window)
    torch.testing.assert_close(got.double(), written_out(query, key, value, mask, 0.3, window), atol=1e-5, rtol=1e-5)


def test_a_longer_padding_mask_covers_tokens_the_cache_dropped():
    """A sliding-window cache keeps the last kv tokens; generate()'s mask covers all: its last kv columns count."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :6] = False   # padding that reaches into the kept tokens
    for given in (mask, padding_bias(mask, query.dtype)):
        got = torch.ops.vgc.causal_attention(query, key, value, given, 0.3, 5)
        torch.testing.assert_close(got.double(), written_out(query, key, value, mask[:, -5:], 0.3), atol=1e-5,
                                   rtol=1e-5)


def test_a_sliced_bias_reaches_sdpa_aligned(monkeypatch):
    """A sliding window's (or a longer mask's) last columns of a bias start mid-row: SDPA's memory-efficient kernel
    faults on that start on the GPU ("misaligned address", H200), so the op hands it an aligned copy."""
    import importlib

    module = importlib.import_module("vgc.ops.causal_attention")   # the package's `causal_attention` is the op
    seen, sdpa = [], module.sdpa

    def recording_sdpa(*args, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(module, "sdpa", recording_sdpa)
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, :4] = False
    for window, kept in ((4, 4), (None, 9)):   # the window's last 4 keys; a mask 2 columns longer than the cache
        got = torch.ops.vgc.causal_attention(query, key, value, padding_bias(mask, query.dtype), 0.3, window)
        bias = seen[-1]
        assert bias.storage_offset() % 16 == 0 and bias.stride(0) % 16 == 0 and bias.shape[-1] == kept
        torch.testing.assert_close(got.double(), written_out(query, key, value, mask[:, -9:], 0.3, window),
                                   atol=1e-5, rtol=1e-5)
    # A bias with values other than 0 and -inf keeps them through the aligned copy
    bias = -torch.rand(2, 11)
    got = torch.ops.vgc.causal_attention(query, key, value, bias, 0.3, None)
    assert seen[-1].storage_offset() % 16 == 0 and torch.equal(seen[-1].reshape(2, 9), bias[:, -9:])
    grouped = query.reshape(2, 2, 2, 8)
    want = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=bias[:, None, None, -9:],
                                                            scale=0.3)
    torch.testing.assert_close(got, want.reshape(2, 1, 4, 8), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("q, kv, window", [(1, 9, None), (4, 4, None), (3, 11, None), (3, 11, 5)],
                         ids=["decode", "prefill", "chunk", "chunk-window"])
def test_a_bias_of_any_values_is_added_as_sdpa_adds_it(q, kv, window):
    """A float padding mask is an additive bias in every path: a caller's own values, not only 0 and -inf, reach the
    scores unchanged (a prefill once read any nonzero value as padding)."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, q, 8), torch.randn(2, 2, kv, 8), torch.randn(2, 2, kv, 8)
    bias = -torch.rand(2, kv) * 3
    bias[1, :2] = float("-inf")   # left padding among the finite values
    got = torch.ops.vgc.causal_attention(query, key, value, bias, 0.3, window)
    positions = torch.arange(kv)
    allowed = positions[None, :] <= positions[kv - q:, None]
    if window is not None:
        allowed &= positions[None, :] > positions[kv - q:, None] - window
    full = bias[:, None, :].masked_fill(~allowed, float("-inf"))
    full = full.masked_fill(torch.isneginf(full).all(-1, keepdim=True), 0)   # a row with no key attends to all
    want = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1), attn_mask=full[:, None], scale=0.3)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=1e-5, rtol=1e-5)
