"""vgc::attention against the slow reference, on CPU.

Tolerance: fp32 inputs, atol 1e-5 (the reference works in float64).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vgc.ops import attention, reference_attention
from vgc.ops.attention import _attend_math, _attend_on_device, _attend_sdpa, _paged_attention, _write_kv
from conftest import triton_device

ATOL = 1e-5


def make_case(specs, num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
              pad=0, seed=0):
    """Op arguments (output excluded) for sequences given as
    (cached context length, new tokens), plus `pad` padding tokens.

    Context slots hold random K/V; every other cache slot holds NaN and
    unused block_table entries are out of range, so that reading a wrong
    block or past seq_len shows in the result or raises."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in specs]
    needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(needed) + 3
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    block_table = torch.full((len(specs), max(needed + [1]) + 1),
                             num_blocks + 100, dtype=torch.int32)
    for b, n in enumerate(needed):
        block_table[b, :n] = torch.tensor(physical[:n], dtype=torch.int32)
        physical = physical[n:]

    def slot(b, p):
        return int(block_table[b, p // block_size]) * block_size \
            + p % block_size

    slots = [slot(b, p) for b, (c, q) in enumerate(specs)
             for p in range(c, c + q)] + [-1] * pad
    context = [slot(b, p) for b, (c, _) in enumerate(specs) for p in range(c)]
    num_tokens = len(slots)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    def cache():
        flat = torch.full((num_blocks * block_size, num_kv_heads, head_dim),
                          float("nan"))
        flat[context] = rand(len(context), num_kv_heads, head_dim)
        return flat.unflatten(0, (num_blocks, block_size))

    return dict(
        query=rand(num_tokens, num_heads, head_dim),
        key=rand(num_tokens, num_kv_heads, head_dim),
        value=rand(num_tokens, num_kv_heads, head_dim),
        key_cache=cache(),
        value_cache=cache(),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_table=block_table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0] + [q for _, q in specs])
        .cumsum(0).to(torch.int32),
        scale=head_dim ** -0.5,
    )


def assert_same(a, b):
    torch.testing.assert_close(a, b, atol=0, rtol=0, equal_nan=True)


def run_op(case, impl="op"):
    """Runs on copies of the caches; returns (output, key_cache, value_cache)."""
    args = dict(case, key_cache=case["key_cache"].clone(),
                value_cache=case["value_cache"].clone())
    output = torch.full_like(case["query"], float("nan"))
    if impl == "op":
        torch.ops.vgc.attention(output, **args)
    else:  # the CUDA path, exercised on CPU
        _paged_attention(output, **args, use_sdpa=True)
    return output, args["key_cache"], args["value_cache"]


CASES = {
    "prefill": dict(specs=[(0, 5), (0, 3), (0, 9)]),
    "prefill_mqa": dict(specs=[(0, 6), (0, 2)], num_kv_heads=1),
    "prefill_mha": dict(specs=[(0, 7)], num_kv_heads=4),
    "decode": dict(specs=[(c, 1) for c in (1, 3, 4, 8, 13)]),
    "mixed": dict(specs=[(0, 5), (7, 1), (13, 4), (9, 0), (0, 0), (2, 3)]),
    "padded": dict(specs=[(0, 4), (6, 1)], pad=3),
    "prefill_padded": dict(specs=[(0, 4), (0, 3)], pad=2),   # new sequences only, then padding rows
}


@pytest.mark.parametrize("impl", ["op", "sdpa"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name, impl):
    case = make_case(**CASES[name])
    out, kc, vc = run_op(case, impl)
    ref_out, ref_kc, ref_vc = reference_attention(**case)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0)
    assert_same(kc, ref_kc)
    assert_same(vc, ref_vc)


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])   # steep: a bias ignored, misplaced or mis-signed shows


@pytest.mark.parametrize("impl", ["op", "sdpa", "on_device"])
@pytest.mark.parametrize("name", ["prefill", "decode", "mixed", "padded"])
def test_alibi_matches_reference(name, impl):
    """ALiBi (Bloom, MPT, Falcon with alibi): slope[h] * (key position - query position) added to the scores, on
    the CPU math path, the SDPA paths of CUDA (per sequence, and every single-token sequence in one call) and the
    on-device path that CUDA graphs hold (ALiBi decode, several tokens per sequence), each against float64."""
    case = dict(make_case(**CASES[name]), alibi_slopes=SLOPES)
    if impl == "on_device":
        args = dict(case, key_cache=case["key_cache"].clone(), value_cache=case["value_cache"].clone())
        out = torch.full_like(case["query"], float("nan"))
        _write_kv(args["key"], args["value"], args["key_cache"], args["value_cache"], args["slot_mapping"])
        _attend_on_device(out, args["query"], args["key_cache"], args["value_cache"], args["block_table"],
                          args["seq_lens"], args["query_start_loc"], args["scale"], SLOPES)
    else:
        out, _, _ = run_op(case, impl)
    ref_out, _, _ = reference_attention(**case)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0)
    without, _, _ = reference_attention(**dict(case, alibi_slopes=None))
    assert (ref_out - without).abs().max() > 0.05   # the bias matters in these cases


def test_alibi_slopes_of_the_wrong_shape_are_refused():
    case = dict(make_case([(0, 3)]), alibi_slopes=SLOPES[:2])
    with pytest.raises(ValueError, match=r"alibi_slopes must be a floating-point tensor of one slope per query "
                                         r"head \(\[4\]\)"):
        run_op(case)


def test_padding_rows_zeroed_and_negative_slots_write_nothing():
    case = make_case([(0, 4), (6, 1)], pad=3)
    out, kc, vc = run_op(case)
    assert torch.count_nonzero(out[5:]) == 0

    written = case["slot_mapping"][case["slot_mapping"] >= 0]
    for new, old, src in ((kc, case["key_cache"], case["key"]),
                          (vc, case["value_cache"], case["value"])):
        expect = old.clone().flatten(0, 1)
        expect[written] = src[:5]
        assert_same(new.flatten(0, 1), expect)


def test_queries_only_see_their_past():
    # Changing the newest key may only change the newest query's output.
    case = make_case([(5, 3)])
    out, _, _ = run_op(case)
    bumped = dict(case, key=case["key"].clone())
    bumped["key"][-1] += 10.0
    out2, _, _ = run_op(bumped)
    torch.testing.assert_close(out2[:-1], out[:-1], atol=0, rtol=0)
    assert not torch.allclose(out2[-1], out[-1])


def test_attend_math_and_sdpa_agree():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 6, 8, generator=gen)
    k, v = torch.randn(2, 7, 2, 8, generator=gen)
    torch.testing.assert_close(_attend_math(q, k, v, 0.3),
                               _attend_sdpa(q, k, v, 0.3), atol=ATOL, rtol=0)


def test_bf16_close_to_reference():
    case = make_case(**CASES["mixed"])
    case16 = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point()
              else v for k, v in case.items()}
    out, _, _ = run_op(case16)
    ref_out, _, _ = reference_attention(**case16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2,
                               rtol=2e-2)


def test_fake_impl():
    case = make_case(**CASES["mixed"])
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if torch.is_tensor(v) else v
                for k, v in case.items()}
        output = torch.empty_like(fake["query"])
        assert torch.ops.vgc.attention(output, **fake) is None
        assert output.shape == case["query"].shape


def test_opcheck_schema_and_fake():
    case = make_case(**CASES["mixed"])
    args = (torch.zeros_like(case["query"]), *case.values())
    torch.library.opcheck(attention, args,
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("name, change", [
    ("key", lambda c: c.update(key=c["key"][..., :4])),
    ("value", lambda c: c.update(value=c["value"][:-1])),
    ("key_cache", lambda c: c.update(key_cache=c["key_cache"][:, :, :1])),
    ("slot_mapping", lambda c: c.update(slot_mapping=c["slot_mapping"].float())),
    ("block_table", lambda c: c.update(block_table=c["block_table"][:1])),
    ("query_start_loc",
     lambda c: c.update(query_start_loc=c["query_start_loc"][:-1])),
    ("seq_lens", lambda c: c.update(seq_lens=c["seq_lens"] - 4)),
])
def test_bad_argument_raises_naming_it(name, change):
    case = make_case([(0, 3), (4, 2)])
    change(case)
    with pytest.raises(ValueError, match=name):
        run_op(case)


# ---- the Triton kernels of the CUDA path --------------------------------------------------------------------------

def _interleaved(cache):
    """The same cache values in a [num_blocks, 2, block_size, H, D] buffer: K and V become strided views."""
    both = torch.stack([cache, cache], dim=1).contiguous()
    return both[:, 0]


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 1), (16, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_triton_decode_and_kv_write_match_reference(heads, layout):
    """The decode kernel (K/V write + attention, GQA groups of 1 to 8) and the KV-write kernel, against the
    float64 reference, with padding rows (slot -1, length 0) and repeated calls (the cached-launch path)."""
    device = triton_device()
    if device is None:
        pytest.skip("needs CUDA, or Triton with TRITON_INTERPRET=1")
    from vgc.ops import triton_attention
    num_heads, num_kv_heads = heads
    contexts = (0, 1, 3, 4, 8, 13, 40)
    case = make_case([(c, 1) for c in contexts] + [(0, 0)] * 2, pad=2, num_heads=num_heads,
                     num_kv_heads=num_kv_heads, head_dim=16, block_size=4)
    ref_out, ref_kc, ref_vc = reference_attention(**case)
    case = {k: v.to(device) if torch.is_tensor(v) else v for k, v in case.items()}
    for call in range(2):
        kc, vc = case["key_cache"].clone(), case["value_cache"].clone()
        if layout == "strided":
            kc, vc = _interleaved(kc), _interleaved(vc)
        output = torch.full_like(case["query"], float("nan"))
        triton_attention.decode_attention(output, case["query"], case["key"], case["value"], kc, vc,
                                          case["slot_mapping"], case["block_table"], case["seq_lens"],
                                          case["scale"])
        torch.testing.assert_close(output.cpu(), ref_out, atol=1e-5, rtol=0, msg=f"call {call}")
        assert_same(kc.cpu(), ref_kc)
        assert_same(vc.cpu(), ref_vc)

        kc, vc = case["key_cache"].clone(), case["value_cache"].clone()
        if layout == "strided":
            kc, vc = _interleaved(kc), _interleaved(vc)
        triton_attention.write_kv(case["key"], case["value"], kc, vc, case["slot_mapping"])
        assert_same(kc.cpu(), ref_kc)
        assert_same(vc.cpu(), ref_vc)
    if device == "cuda":   # the repeated calls above went through the cached-binary launch
        assert triton_attention._launch_decode.binaries and triton_attention._launch_write_kv.binaries


@pytest.mark.parametrize("variant", [("head", 32, 4, 1), ("head", 16, 1, 1), ("grouped-dot", 32, 4, 1),
                                     ("grouped-dot", 64, 4, 1), ("grouped-dot", 16, 4, 4), ("grouped-dot", 16, 2, 16),
                                     ("grouped-dot", 32, 4, 8), None])
@pytest.mark.parametrize("heads, head_dim", [((4, 4), 16), ((8, 2), 16), ((16, 1), 16), ((8, 2), 24), ((8, 2), 8)])
def test_every_decode_kernel_variant_matches_reference(variant, heads, head_dim):
    """Each way the decode kernel can be launched (a program per query head, or per KV head with tensor-core
    scores; tile and warp counts; the context split over programs and merged, or not; None: the default) in fp16,
    against the float64 reference: contexts within and across tiles and splits, empty sequences, padding rows, a
    head size that is no power of two, one below the 16 a tensor-core product needs (compiled on a GPU only)."""
    device = triton_device()
    if device is None:
        pytest.skip("needs CUDA, or Triton with TRITON_INTERPRET=1")
    from vgc.ops import triton_attention
    case = make_case([(c, 1) for c in (0, 1, 15, 16, 40, 70)] + [(0, 0)], pad=1, num_heads=heads[0],
                     num_kv_heads=heads[1], head_dim=head_dim, block_size=4)
    case = {k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in case.items()}
    ref_out, ref_kc, ref_vc = reference_attention(**case)
    case = {k: v.to(device) if torch.is_tensor(v) else v for k, v in case.items()}
    for call in range(2):   # the second launch counts the splits' arrivals from where the first left them
        output = torch.full_like(case["query"], float("nan"))
        triton_attention.decode_attention(output, case["query"], case["key"], case["value"], case["key_cache"],
                                          case["value_cache"], case["slot_mapping"], case["block_table"],
                                          case["seq_lens"], case["scale"], variant=variant)
        torch.testing.assert_close(output.cpu().float(), ref_out.float(), atol=1e-2, rtol=0, msg=f"call {call}")
        assert_same(case["key_cache"].cpu(), ref_kc)
        assert_same(case["value_cache"].cpu(), ref_vc)
        for arrivals in triton_attention._ARRIVALS.values():   # the last split of each launch set them back
            assert not arrivals.any()


def test_split_decode_counts_arrivals_per_cache_and_keeps_a_captures_own(monkeypatch):
    """The split kernel's arrival counts: one set per KV cache, reused by its later launches and left at 0 by each;
    a set made while a graph is captured (its zeroing a step of that graph, run only at its replays) is that
    graph's alone, never handed to a later launch."""
    device = triton_device()
    if device is None:
        pytest.skip("needs CUDA, or Triton with TRITON_INTERPRET=1")
    from vgc import cuda_runtime
    from vgc.ops import triton_attention
    case = make_case([(c, 1) for c in (0, 5, 21)], pad=0, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
    case = {k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in case.items()}
    ref_out, _, _ = reference_attention(**case)
    case = {k: v.to(device) if torch.is_tensor(v) else v for k, v in case.items()}
    key = (case["key_cache"].device, case["key_cache"].data_ptr())

    def launch():
        output = torch.full_like(case["query"], float("nan"))
        triton_attention.decode_attention(output, case["query"], case["key"], case["value"], case["key_cache"],
                                          case["value_cache"], case["slot_mapping"], case["block_table"],
                                          case["seq_lens"], case["scale"], variant=("grouped-dot", 16, 4, 4))
        torch.testing.assert_close(output.cpu().float(), ref_out.float(), atol=1e-2, rtol=0)

    triton_attention._ARRIVALS.pop(key, None)
    if device == "cpu":   # a capture on the CPU: only the query says so (nothing is recorded)
        monkeypatch.setattr(cuda_runtime, "stream_capturing", lambda: True)
        kept = len(triton_attention._KEPT)
        launch()
        assert key not in triton_attention._ARRIVALS and len(triton_attention._KEPT) == kept + 1
        monkeypatch.undo()
    launch()
    arrivals = triton_attention._ARRIVALS[key]
    launch()
    assert triton_attention._ARRIVALS[key] is arrivals and not arrivals.any()


@pytest.mark.parametrize("variant, dtype, message", [
    (("head", 32, 4, 4), torch.float16, "does not split the context"),
    (("grouped-dot", 32, 4, 1), torch.float32, "round a torch.float32 cache to tf32"),
    (("fma", 32, 4, 1), torch.float16, "must be 'head' or 'grouped-dot', got 'fma'"),
])
def test_a_decode_variant_that_cannot_serve_the_call_is_refused_before_any_launch(variant, dtype, message):
    """Refused on the host, naming the problem: no kernel is compiled or launched for them."""
    if triton_device() is None:
        pytest.skip("needs CUDA, or Triton with TRITON_INTERPRET=1")
    from vgc.ops import triton_attention
    case = make_case([(3, 1)], pad=0, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
    case = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in case.items()}
    output = torch.full_like(case["query"], float("nan"))
    with pytest.raises(ValueError, match=message):
        triton_attention.decode_attention(output, case["query"], case["key"], case["value"], case["key_cache"],
                                          case["value_cache"], case["slot_mapping"], case["block_table"],
                                          case["seq_lens"], case["scale"], variant=variant)
    assert output.isnan().all()


def test_varlen_attention_attends_within_each_sequence_and_zeroes_padding_rows():
    torch.manual_seed(0)
    q, k, v = (torch.randn(12, 2, 8) for _ in range(3))
    cu = torch.tensor([0, 3, 3, 8, 10, 10], dtype=torch.int32)   # an empty sequence, then 2 padding rows
    out = torch.ops.vgc.varlen_attention(q, k, v, cu, 64, 8 ** -0.5)
    mask = torch.zeros(12, 12, dtype=torch.bool)
    for start, end in ((0, 3), (3, 8), (8, 10)):
        mask[start:end, start:end] = True
    heads_first = [t.transpose(0, 1) for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*heads_first, attn_mask=mask, scale=8 ** -0.5)
    want = want.transpose(0, 1)
    torch.testing.assert_close(out[:10], want[:10], atol=1e-5, rtol=1e-5)
    assert out[10:].abs().max() == 0 and out.is_contiguous()


@pytest.mark.parametrize("name, specs, pad", [
    ("speculative k=3", [(c, 4) for c in (1, 5, 12, 0)], 0),
    ("speculative k=3, padded", [(c, 4) for c in (3, 9)], 8),
    ("mixed", CASES["mixed"]["specs"], 2),
    ("prefill", CASES["prefill"]["specs"], 0),
])
def test_inside_a_graph_several_tokens_per_sequence_attend_on_the_device(name, specs, pad, monkeypatch):
    # inside a capture no host sync is allowed: the op then finds each token's sequence on the device
    import sys

    from vgc import cuda_runtime

    attention_module = sys.modules["vgc.ops.attention"]   # the package exports the op under the module's name
    case = make_case(specs, pad=pad)
    monkeypatch.setattr(cuda_runtime, "stream_capturing", lambda: True)
    reads = []
    monkeypatch.setattr(attention_module, "_read_lengths", lambda *a: reads.append(a))   # a host read shows here
    out, kc, vc = run_op(case)
    ref_out, ref_kc, ref_vc = reference_attention(**case)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0, msg=name)
    assert_same(kc, ref_kc)
    assert_same(vc, ref_vc)
    assert not reads


def test_fresh_prefill_falls_back_when_flash_refuses_and_raises_out_of_memory(monkeypatch):
    """The CUDA path's fresh-prefill launch (`flash_varlen_forward`) on a device whose flash kernel refuses (the CPU
    has none: a real refusal): the prefill attends per sequence, equal to the reference, and the refusal is
    remembered (no second try). An out-of-memory error there is raised, not taken for a refusal."""
    import importlib

    attention_module = importlib.import_module("vgc.ops.attention")   # the package's `attention` is the op
    calls = []
    flash = attention_module._compat.flash_varlen_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return flash(*args, **kwargs)

    monkeypatch.setattr(attention_module._compat, "flash_varlen_forward", counted)
    monkeypatch.setattr(attention_module, "_flash_refused", set())
    case = make_case(**CASES["prefill"])
    case = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in case.items()}
    ref_out, _, _ = reference_attention(**case)
    for _ in range(2):
        out, _, _ = run_op(case, impl="sdpa")
        torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    assert len(calls) == 1 and attention_module._flash_refused == {(torch.device("cpu"), torch.bfloat16, 8)}

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("injected")

    monkeypatch.setattr(attention_module._compat, "flash_varlen_forward", out_of_memory)
    monkeypatch.setattr(attention_module, "_flash_refused", set())
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        run_op(case, impl="sdpa")
    assert not attention_module._flash_refused
