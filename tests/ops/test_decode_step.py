"""The decode step's speed paths: attention reading the lengths once per call, and `vgc::skinny_mm` with its
pass (the kernel under Triton's CPU interpreter where Triton is installed, on CUDA in the gpu-marked tests)."""


import importlib

import pytest
import torch

import vgc
from vgc.models import llama
from vgc.ops import triton_rows
from vgc.ops.skinny_mm import MAX_M, uses_fused_kernel, uses_kernel
from vgc.ops.triton_skinny_mm import skinny_mm_into
from conftest import FP32_TOL, triton_device

attention_module = importlib.import_module("vgc.ops.attention")   # vgc.ops.attention is also the op's name


def _count_length_reads(monkeypatch) -> list:
    reads = []
    real = attention_module._read_lengths

    def counted(query_start_loc, seq_lens):
        reads.append(1)
        return real(query_start_loc, seq_lens)

    monkeypatch.setattr(attention_module, "_read_lengths", counted)
    return reads


def test_a_compiled_prefill_reads_its_lengths_once_per_call_not_once_per_layer(tiny, no_cache, monkeypatch):
    cfg, model = tiny
    reads = _count_length_reads(monkeypatch)
    compiled = vgc.compile(model, dynamic_arg_dims={k: 0 for k in llama.PAD_VALUES})
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    with torch.no_grad():
        for n in (7, 12):
            reads.clear()
            expected = model(**llama.make_batch(cfg, n, "prefill"))
            assert len(reads) == cfg.num_layers   # eager: one host read per layer
            reads.clear()
            out = compiled(**llama.make_batch(cfg, n, "prefill"))
            assert len(reads) == 1, f"{len(reads)} host reads of the lengths in one compiled call of {n} tokens"
            torch.testing.assert_close(out, expected, **FP32_TOL)


def test_lengths_written_in_place_within_a_call_are_read_again():
    starts, lens = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32)
    seen = []

    @attention_module.lengths_read_once
    def forward():
        seen.append(attention_module._host_lengths(starts, lens))
        seen.append(attention_module._host_lengths(starts, lens))   # the same call, unchanged: shared
        lens.copy_(torch.tensor([2, 4], dtype=torch.int32))          # an in-place write bumps the version
        starts[2] = 6
        seen.append(attention_module._host_lengths(starts, lens))

    @attention_module.lengths_read_once
    def forward_with_fresh_tensors():
        # Length tensors made and freed inside the call: a later one may get the same memory, never the same answer
        for n in range(2, 6):
            seen.append(attention_module._host_lengths(torch.tensor([0, n], dtype=torch.int32),
                                                       torch.tensor([n], dtype=torch.int32)))

    forward()
    forward_with_fresh_tensors()
    assert seen[3:] == [([0, n], [n]) for n in range(2, 6)]
    assert seen[0] is seen[1]
    assert seen[2] == ([0, 2, 6], [2, 4])
    assert attention_module._call_lengths.get() is None   # the memo lives for one call only
    assert attention_module._host_lengths(starts, lens) == ([0, 2, 6], [2, 4])


@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_the_skinny_mm_kernel_matches_a_float32_product(m, monkeypatch):
    device = triton_device()
    if device is None:
        pytest.skip("needs CUDA, or Triton with TRITON_INTERPRET=1")
    monkeypatch.setenv("VGC_SKINNY_MM_ON_CPU", "1")
    # fp16: Triton's CPU interpreter has no bf16; on CUDA both run
    dtypes = (torch.float16, torch.bfloat16) if device == "cuda" else (torch.float16,)
    torch.manual_seed(m)
    for dtype in dtypes:
        for n, k in ((48, 64), (33, 70), (2048, 512)):
            a = torch.randn(m, k, dtype=dtype, device=device)
            w = torch.randn(n, k, dtype=dtype, device=device)
            if m <= MAX_M:   # through the op
                assert uses_kernel(a, w.t())
                out = torch.ops.vgc.skinny_mm(a, w.t())
            else:            # the kernel itself, as the sweep calls it
                out = a.new_empty(m, n)
                skinny_mm_into(out, a, w.t())
            expected = a.float() @ w.float().t()
            torch.testing.assert_close(out.float(), expected, atol=0.05 * expected.abs().max().item(), rtol=0)


def _fused_reference(a, residual, w, norm_weight, eps, silu_mul, rope=None):
    """The fused skinny matmuls in float64: (the residual sum, the product)."""
    h = a.double() if residual is None else a.double() + residual.double()
    x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.double()
    p = x @ w.double().t()
    if silu_mul:
        gate, up = p.chunk(2, dim=-1)
        p = torch.nn.functional.silu(gate) * up
    if rope is not None:
        cos, sin, columns, head_dim = rope
        heads = p[:, :columns].unflatten(-1, (-1, head_dim))
        first, second = heads.chunk(2, dim=-1)
        half = head_dim // 2
        c, s = cos[:, :half].double().unsqueeze(1), sin[:, :half].double().unsqueeze(1)
        if cos.shape[-1] == head_dim:   # full-width tables: each column its own angle (transformers' rotate_half)
            c2, s2 = cos[:, half:].double().unsqueeze(1), sin[:, half:].double().unsqueeze(1)
        else:
            c2, s2 = c, s
        p = torch.cat((torch.cat((first * c - second * s, second * c2 + first * s2), -1).flatten(1), p[:, columns:]),
                      -1)
    return h, p


@pytest.mark.parametrize("add,silu_mul,rope", [(False, False, None), (False, True, None), (True, False, None),
                                               (True, True, None), (False, False, "half"), (True, False, "half"),
                                               (False, False, "full"), (True, False, "full")])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_fused_skinny_matmuls_match_a_float64_reference(add, silu_mul, rope, rows, monkeypatch):
    """`vgc::skinny_mm_fused` (norm, product, gate or rotary embedding) and `vgc::skinny_mm_add_fused` (a residual
    add first): one row runs the fused kernel (CUDA, or Triton's interpreter on the CPU); more rows, or no Triton,
    run the parts one after another. Both against float64, the weight in a (2048, 512) and an odd (48, 70) shape
    (rotated: heads of 16, the first 32 or 1024 columns; "half": 8 values per row, taken from a strided view of
    wider rows; "full": 16 independent values per row, so each half of a head turns by its own)."""
    monkeypatch.setenv("VGC_SKINNY_MM_ON_CPU", "1")
    device = triton_device() or "cpu"
    dtypes = (torch.float16, torch.bfloat16) if device == "cuda" else (torch.float16,)
    gen = torch.Generator(device=device).manual_seed(rows)
    for dtype in dtypes:
        for n, k in ((2048, 512), (48, 70)):
            a = torch.randn(rows, k, generator=gen, device=device).to(dtype)
            residual = torch.randn(rows, k, generator=gen, device=device).to(dtype) if add else None
            w = (torch.randn(n, k, generator=gen, device=device) * k ** -0.5).to(dtype)
            norm_weight = (torch.rand(k, generator=gen, device=device) + 0.5).to(dtype)
            tables = None
            if rope:
                angles = torch.rand(rows, 16, generator=gen, device=device) * 6.3
                if rope == "half":
                    angles = angles[:, ::2]   # 8 per row, strided
                tables = (angles.cos(), angles.sin(), min(n // 2 // 16 * 16, 1024), 16)
            if rows == 1 and triton_device() is not None:
                assert uses_fused_kernel(a, w.t(), norm_weight, residual)
            if add:
                h, got = torch.ops.vgc.skinny_mm_add_fused(a, residual, w.t(), norm_weight, 1e-5, silu_mul,
                                                           *(tables or ()))
            else:
                h, got = None, torch.ops.vgc.skinny_mm_fused(a, w.t(), norm_weight, 1e-5, silu_mul, *(tables or ()))
            expected_h, expected = _fused_reference(a, residual, w, norm_weight, 1e-5, silu_mul, tables)
            assert got.shape == expected.shape and got.dtype == dtype
            torch.testing.assert_close(got.double(), expected, atol=0.02 * expected.abs().max().item(), rtol=0.02)
            if add:   # the sum, rounded once to the activations' dtype, as eager's
                torch.testing.assert_close(h, a + residual, atol=0, rtol=0)


def test_skinny_mm_falls_back_to_torch_mm_outside_its_shapes():
    w = torch.randn(24, 16, dtype=torch.bfloat16)
    for a, b in ((torch.randn(MAX_M + 1, 16, dtype=torch.bfloat16), w.t()),   # too many rows
                 (torch.randn(4, 16), w.float().t()),                         # fp32
                 (torch.randn(4, 24, dtype=torch.bfloat16), w)):              # b not K-contiguous
        assert not uses_kernel(a, b)
        torch.testing.assert_close(torch.ops.vgc.skinny_mm(a, b), torch.mm(a, b), atol=0, rtol=0)


class _Linears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64, bias=True, dtype=torch.float16)
        self.down = torch.nn.Linear(64, 32, bias=False, dtype=torch.float16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_the_skinny_matmuls_pass_rewrites_small_matmuls_and_leaves_large_ones(no_cache, monkeypatch, tmp_path):
    """With the pass on (and allowed on CPU pieces), the mm and addmm of a call with few rows become
    vgc::skinny_mm; a static call with more than MAX_M rows keeps aten's. Outputs equal eager either way."""
    monkeypatch.setenv("VGC_SKINNY_MM_ON_CPU", "1")
    monkeypatch.setenv("VGC_DEBUG_DUMP_PATH", str(tmp_path))
    torch.manual_seed(0)
    model = _Linears().eval()
    compiled = torch.compile(model, backend="vgc", dynamic=False, options={
        "pass_config": {"skinny_matmuls": True},
        "inductor_compile_config": {"fx_graph_cache": False}})   # this test's own compile, whatever ran before
    with torch.no_grad():
        for rows in (MAX_M, MAX_M + 36):
            x = torch.randn(rows, 32, dtype=torch.float16)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-3, rtol=2e-3)
    after = sorted(p for p in tmp_path.iterdir() if "after-skinny_matmuls" in p.name)
    assert len(after) == 2, [p.name for p in tmp_path.iterdir()]
    small, large = (p.read_text() for p in after)
    assert small.count("vgc.skinny_mm") == 2 and "aten.mm" not in small and "aten.addmm" not in small
    assert "vgc.skinny_mm" not in large and "aten.addmm" in large and "aten.mm" in large


class _GatedBlock(torch.nn.Module):
    """A Llama MLP block: RMSNorm, gate/up, SiLU-and-multiply, down, residual."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.rand(32, dtype=torch.float16) + 0.5)
        self.gate_up = torch.nn.Linear(32, 128, bias=False, dtype=torch.float16)
        self.down = torch.nn.Linear(64, 32, bias=False, dtype=torch.float16)

    def forward(self, x):
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.norm
        gate, up = self.gate_up(normed).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


def test_the_fusion_pass_puts_the_norm_gate_and_residual_into_the_matmuls_inductor_compiles(no_cache, monkeypatch,
                                                                                          tmp_path):
    """Through Inductor: a call with one row gets its norm and gate fused into the gate/up matmul, and no norm or
    activation kernel of Inductor's; a call with more rows than MAX_M keeps aten's graph. Outputs equal eager."""
    monkeypatch.setenv("VGC_SKINNY_MM_ON_CPU", "1")
    monkeypatch.setenv("VGC_DEBUG_DUMP_PATH", str(tmp_path))
    torch.manual_seed(0)
    model = _GatedBlock().eval()
    compiled = torch.compile(model, backend="vgc", dynamic=False, options={
        "pass_config": {"skinny_matmuls": True, "skinny_matmul_fusion": True},
        "inductor_compile_config": {"fx_graph_cache": False}})
    with torch.no_grad():
        for rows in (1, 40):
            x = torch.randn(rows, 32, dtype=torch.float16)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-3, rtol=2e-3)
    after = sorted(p for p in tmp_path.iterdir() if "after-skinny_matmul_fusion" in p.name)
    assert len(after) == 2, [p.name for p in tmp_path.iterdir()]
    one_row, many = (p.read_text() for p in after)
    assert one_row.count("vgc.skinny_mm_fused.default]") == 1 and one_row.count("vgc.skinny_mm.default]") == 1
    assert "aten.mean" not in one_row and "aten.exp" not in one_row
    assert "skinny_mm" not in many and "aten.mean" in many


def test_the_skinny_matmuls_pass_is_on_by_default_and_keyed_by_what_it_does(monkeypatch):
    from vgc.passes.manager import pass_manager

    default = pass_manager(vgc.CompilationConfig().pass_config, {})
    # measured faster (docs/benchmarks.md); the fusion runs after the pass whose ops it fuses
    assert [p.name for p in default.passes] == ["outer_products", "skinny_matmuls", "skinny_matmul_fusion",
                                                "skinny_matmul_rope"]
    # the fusion works on the other pass's ops: off with it
    alone = pass_manager(vgc.CompilationConfig(pass_config={"skinny_matmuls": False}).pass_config, {})
    assert [p.name for p in alone.passes] == ["outer_products"]
    on = pass_manager({"skinny_matmuls": True}, {}).uuid()
    monkeypatch.setenv("VGC_SKINNY_MM_ON_CPU", "1")
    assert pass_manager({"skinny_matmuls": True}, {}).uuid() != on


@pytest.mark.gpu
@pytest.mark.parametrize("fusion", ["none", "default", "rope"])
def test_the_decoder_with_skinny_matmuls_equals_eager_in_every_graph_mode(no_cache, fusion):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = llama.tiny_config()
    cfg.dtype = torch.bfloat16
    with torch.device("cuda"):
        model = llama.Llama(cfg).eval()
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = vgc.compile(model, config=vgc.CompilationConfig(
        cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 4, 8, 16],
        pass_config={"skinny_matmuls": True, "skinny_matmul_fusion": fusion != "none",
                     "skinny_matmul_rope": fusion == "rope"},
        inductor_compile_config={"fx_graph_cache": False}),
        pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                    make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
    with torch.no_grad():
        for n, kind in ((1, "decode"), (3, "decode"), (16, "decode"), (12, "prefill"), (100, "decode")):
            out = compiled(**llama.make_batch(cfg, n, kind, device="cuda", kv_caches=kv)).clone()
            expected = model(**llama.make_batch(cfg, n, kind, device="cuda", kv_caches=kv))
            torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2, msg=f"{kind} {n}")


def _pdl_replays_give_the_plain_bits(chain) -> tuple:
    """`chain(pdl)` (launches returning a tuple of tensors) captured with PDL in one graph and replayed 20 times
    gives the bits of `chain(False)`, ordinary launches; returns those."""
    expected = chain(False)
    chain(True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(True)
    for _ in range(20):
        for t in got:
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(g, e) for g, e in zip(got, expected))
    return expected


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8])
def test_kernels_chained_by_programmatic_dependent_launch_give_the_bits_of_ordinary_launches(rows):
    """Each product reads the one before it, replayed in one CUDA graph: a kernel that read its input before its
    predecessor finished would give different bits from the same kernels launched one after another."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a CUDA GPU with programmatic dependent launch (sm_90 or later)")
    gen = torch.Generator(device="cuda").manual_seed(rows)
    shapes = [(3072, 2048), (2048, 2048), (8192, 2048), (2048, 8192)] * 4
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5 for n, k in shapes]
    x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)

    def chain(pdl):
        h = x
        for w in weights:
            if h.shape[1] != w.shape[1]:
                h = h[:, :w.shape[1]].contiguous() if h.shape[1] > w.shape[1] else h.repeat(1, w.shape[1] // h.shape[1])
            out = torch.empty(rows, w.shape[0], device="cuda", dtype=torch.bfloat16)
            skinny_mm_into(out, h, w.t(), pdl=pdl)
            h = out
        return h

    (expected,) = _pdl_replays_give_the_plain_bits(lambda pdl: (chain(pdl),))
    reference = x.float()
    for w in weights:
        if reference.shape[1] != w.shape[1]:
            reference = (reference[:, :w.shape[1]] if reference.shape[1] > w.shape[1]
                         else reference.repeat(1, w.shape[1] // reference.shape[1]))
        reference = (reference.bfloat16().float() @ w.float().t()).bfloat16().float()
    torch.testing.assert_close(expected.float(), reference, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_fused_kernels_chained_by_programmatic_dependent_launch_give_the_bits_of_ordinary_launches():
    """A decode step's MLPs as the fusion pass leaves them (residual add + norm + gate/up + SiLU-and-multiply in one
    launch, then down), sixteen layers replayed in one CUDA graph: each sum reads a residual written two kernels
    back, and a program reads the sum its neighbour's first program stored."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a CUDA GPU with programmatic dependent launch (sm_90 or later)")
    gen = torch.Generator(device="cuda").manual_seed(47)
    layers = [((torch.randn(16384, 2048, device="cuda", generator=gen) * 2048 ** -0.5).bfloat16(),
               (torch.randn(2048, 8192, device="cuda", generator=gen) * 8192 ** -0.5).bfloat16(),
               (torch.rand(2048, device="cuda", generator=gen) + 0.5).bfloat16()) for _ in range(16)]
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)

    def chain(pdl):
        h, delta = x, torch.zeros_like(x)
        for w_gate_up, w_down, norm_w in layers:
            total = torch.empty(1, 2048, device="cuda", dtype=torch.bfloat16)
            act = torch.empty(1, 8192, device="cuda", dtype=torch.bfloat16)
            skinny_mm_into(act, delta, w_gate_up.t(), pdl=pdl, norm_weight=norm_w, eps=1e-5, gated=True,
                           residual=h, h=total)
            delta = torch.empty(1, 2048, device="cuda", dtype=torch.bfloat16)
            skinny_mm_into(delta, act, w_down.t(), pdl=pdl)
            h = total
        return h, delta

    expected = _pdl_replays_give_the_plain_bits(chain)
    h, delta = x.double(), torch.zeros_like(x, dtype=torch.float64)
    for w_gate_up, w_down, norm_w in layers:
        h = h + delta
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w.double()
        gate, up = (normed @ w_gate_up.double().t()).chunk(2, dim=-1)
        delta = (torch.nn.functional.silu(gate) * up) @ w_down.double().t()
    reference = h + delta
    result = expected[0].double() + expected[1].double()
    torch.testing.assert_close(result, reference, atol=0.05 * reference.abs().max().item(), rtol=0.05)


@pytest.mark.gpu
def test_decode_attention_chained_by_programmatic_dependent_launch_gives_the_bits_of_ordinary_launches(monkeypatch):
    """Sixteen layers of q/k/v projection -> decode attention (its context split over 4 programs, merged by the
    last to arrive) -> output projection, replayed in one CUDA graph with every kernel a PDL dependent: an attention
    program that read q/k/v before the projection finished, a merge that read a split's state before it was
    stored, or an arrival count not back at 0 for the next replay would give other bits than ordinary launches."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a CUDA GPU with programmatic dependent launch (sm_90 or later)")
    from vgc.ops import triton_attention

    gen = torch.Generator(device="cuda").manual_seed(26)
    heads, kv_heads, head_dim, block, context = 32, 8, 64, 16, 40
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    layers = [((torch.randn(heads * head_dim + 2 * kv_heads * head_dim, 2048, generator=gen, device="cuda")
                * 2048 ** -0.5).bfloat16(),
               (torch.randn(2048, heads * head_dim, generator=gen, device="cuda") * 2048 ** -0.5).bfloat16(),
               torch.randn(8, block, kv_heads, head_dim, generator=gen, **bf16),
               torch.randn(8, block, kv_heads, head_dim, generator=gen, **bf16)) for _ in range(16)]
    block_table = torch.tensor([[5, 2, 7, 0]], device="cuda", dtype=torch.int32)
    seq_lens = torch.tensor([context + 1], device="cuda", dtype=torch.int32)
    slot_mapping = torch.tensor([7 * block + context % block], device="cuda")   # position 40: block table entry 2
    x = torch.randn(1, 2048, generator=gen, **bf16)
    pdl_on = [False]
    monkeypatch.setattr(triton_attention, "uses_pdl", lambda t: pdl_on[0])

    def chain(pdl):
        pdl_on[0] = pdl
        h = x
        for w_qkv, w_o, key_cache, value_cache in layers:
            qkv = torch.empty(1, w_qkv.shape[0], **bf16)
            skinny_mm_into(qkv, h, w_qkv.t(), pdl=pdl)
            q = qkv[:, :heads * head_dim].view(1, heads, head_dim)
            k, v = (qkv[:, heads * head_dim + i * kv_heads * head_dim:][:, :kv_heads * head_dim]
                    .view(1, kv_heads, head_dim) for i in (0, 1))
            attn = torch.empty(1, heads, head_dim, **bf16)
            triton_attention.decode_attention(attn, q, k, v, key_cache, value_cache, slot_mapping, block_table,
                                              seq_lens, head_dim ** -0.5)
            h = torch.empty(1, 2048, **bf16)
            skinny_mm_into(h, attn.view(1, -1), w_o.t(), pdl=pdl)
        return (h,)

    assert triton_attention._decode_variant(1, kv_heads, head_dim, torch.bfloat16)[3] == 4   # the split path
    (expected,) = _pdl_replays_give_the_plain_bits(chain)
    assert expected.isfinite().all() and expected.abs().max() > 0
    for arrivals in triton_attention._ARRIVALS.values():
        assert not arrivals.any()
