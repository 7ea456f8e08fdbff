"""The skinny_matmul_fusion pass on graphs as Inductor hands them over (ATen, Inductor's decompositions): what it
fuses into `vgc::skinny_mm_fused`, what it must leave alone, and that the rewritten graph computes the same."""

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.fx.experimental.proxy_tensor import make_fx

from vgc.passes.skinny_fusion import fuse_skinny_neighbours
from vgc.passes.skinny_matmul import use_skinny_matmuls

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _skinny_on_cpu(monkeypatch):
    monkeypatch.setenv("VGC_SKINNY_MM_ON_CPU", "1")   # the pass rewrites CPU graphs; the op runs its row path


def _rms_norm(x, w, eps=1e-6, weight_first=False):
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w * normed if weight_first else normed * w


def _fused(fn, *args, tracing_mode="fake", dynamic=None):
    """fn traced as Inductor sees it, after skinny_matmuls and this pass: (graph module, per fused op its kind:
    ('add',) if it sums a residual first, then 'silu' if it gates, and its eps). `dynamic`: {argument index: its
    symbolic dims}, every other size static (as Inductor's pieces: tokens symbolic, weights not)."""
    if dynamic is not None:
        mode = FakeTensorMode(shape_env=ShapeEnv())
        args = [mode.from_tensor(a, symbolic_context=StatelessSymbolicContext(dynamic_sizes=[
            DimDynamic.DYNAMIC if d in dynamic.get(i, ()) else DimDynamic.STATIC for d in range(a.dim())]))
            for i, a in enumerate(args)]
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode=tracing_mode)(*args)
    gm.graph.eliminate_dead_code()
    use_skinny_matmuls(gm.graph)
    fuse_skinny_neighbours(gm.graph)
    gm.recompile()
    fused = []
    for n in gm.graph.nodes:
        if n.target is torch.ops.vgc.skinny_mm_fused.default:
            fused.append((("silu",) if n.args[4] else ()) + (n.args[3],))
        elif n.target is torch.ops.vgc.skinny_mm_add_fused.default:
            fused.append(("add",) + (("silu",) if n.args[5] else ()) + (n.args[4],))
    return gm, fused


def _close(got, want):
    """bf16 results of differently rounded but equal computations: the fused kernel scales the sums by the norm
    and accumulates in fp32 where eager rounds between steps, a few bf16 steps of the largest value apart (a wrong
    fusion is off by the values themselves)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=0.03 * want.abs().max().item(), rtol=0.03)


def _weights(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float32).mul(shape[-1] ** -0.5).to(BF16) for shape in shapes]


def test_a_llama_layer_becomes_two_fused_matmuls_and_two_plain_ones_computing_the_same():
    """o, then residual add + norm + gate/up + gate, then down, then residual add + norm + qkv: the sums, which
    later nodes read, come out of the fused ops."""
    x, attn = torch.randn(1, 64, dtype=BF16), torch.randn(1, 64, dtype=BF16)
    norm_1, norm_2 = (torch.rand(64, dtype=BF16) + 0.5 for _ in range(2))
    w_o, w_gate_up, w_down, w_qkv = _weights((64, 64), (256, 64), (64, 128), (96, 64))

    def layer(x, attn, norm_1, norm_2, w_o, w_gate_up, w_down, w_qkv):
        h = x + F.linear(attn, w_o)
        gate, up = F.linear(_rms_norm(h, norm_1), w_gate_up).chunk(2, dim=-1)
        h2 = h + F.linear(F.silu(gate) * up, w_down)
        return h2, F.linear(_rms_norm(h2, norm_2, eps=1e-5), w_qkv)

    args = (x, attn, norm_1, norm_2, w_o, w_gate_up, w_down, w_qkv)
    gm, fused = _fused(layer, *args)
    assert fused == [("add", "silu", 1e-6), ("add", 1e-5)]
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.vgc.skinny_mm.default) == 2   # o and down, their inputs not a norm's
    assert torch.ops.aten.mean.dim not in ops and torch.ops.aten.add.Tensor not in ops   # nothing left over
    for got, want in zip(gm(*args), layer(*args)):
        _close(got, want)


def test_transformers_spelling_three_dims_weight_first_narrowed_halves_and_residual_first():
    """transformers' Llama: [B, T, H] activations, `weight * normed`, gate/up as narrows of one fused linear
    (vgc's sibling fusion), `residual + out`; and qkv after the first norm, whose input is no sum."""
    x = torch.randn(1, 1, 64, dtype=BF16)
    norm_w = torch.rand(64, dtype=BF16) + 0.5
    w_qkv, w_o, w_gate_up = _weights((96, 64), (64, 96), (256, 64))

    def layer(x, norm_w, w_qkv, w_o, w_gate_up):
        qkv = F.linear(_rms_norm(x, norm_w, weight_first=True), w_qkv)
        h = x + F.linear(qkv, w_o)
        both = F.linear(_rms_norm(h, norm_w, eps=1e-5, weight_first=True), w_gate_up)
        gate, up = both.narrow(-1, 0, 128), both.narrow(-1, 128, 128)
        return h * 2, F.silu(gate) * up

    gm, fused = _fused(layer, x, norm_w, w_qkv, w_o, w_gate_up)
    assert fused == [(1e-6,), ("add", "silu", 1e-5)]
    for got, want in zip(gm(x, norm_w, w_qkv, w_o, w_gate_up), layer(x, norm_w, w_qkv, w_o, w_gate_up)):
        assert got.shape == want.shape
        _close(got, want)


def test_what_has_another_reader_or_another_shape_is_left_alone():
    x = torch.randn(1, 64, dtype=BF16)
    norm_w = torch.rand(64, dtype=BF16) + 0.5
    bias = torch.randn(64, dtype=BF16)
    w_up, w_mixed, w_down = _weights((256, 64), (192, 64), (64, 128))

    def block(x, norm_w, bias, w_up, w_mixed, w_down):
        normed = _rms_norm(x, norm_w)
        both = F.linear(normed, w_up)                      # normed read twice (here and below): no fusion
        gate, up = both.chunk(2, dim=-1)
        activated = F.silu(gate)
        mixed = F.linear(normed, w_mixed).split([64, 128], dim=-1)     # unequal halves: not a gate
        down = F.linear(activated * up, w_down)
        return down + bias, activated.sum(), mixed[0] * 2            # a broadcast add; silu read elsewhere

    gm, fused = _fused(block, x, norm_w, bias, w_up, w_mixed, w_down)
    assert fused == []
    for got, want in zip(gm(x, norm_w, bias, w_up, w_mixed, w_down), block(x, norm_w, bias, w_up, w_mixed, w_down)):
        _close(got, want)


def test_a_sum_read_before_the_fused_op_would_run_keeps_its_add():
    """The residual sum is also read between the add and the matmul: the norm still fuses, the add stays."""
    x, delta = torch.randn(1, 64, dtype=BF16), torch.randn(1, 64, dtype=BF16)
    norm_w = torch.rand(64, dtype=BF16) + 0.5
    (w_qkv,) = _weights((96, 64))

    def block(x, delta, norm_w, w_qkv):
        h = x + delta
        early = h * 3
        return early, F.linear(_rms_norm(h, norm_w), w_qkv) + early[:, :1]

    gm, fused = _fused(block, x, delta, norm_w, w_qkv)
    assert fused == [(1e-6,)]
    for got, want in zip(gm(x, delta, norm_w, w_qkv), block(x, delta, norm_w, w_qkv)):
        _close(got, want)


def test_many_rows_run_the_fused_op_in_parts_with_the_same_result():
    """A symbolic-size piece takes prefills through the same fused op: more rows than the kernel's run the add and
    norm as one row kernel, then the product and the gate."""
    norm_w = torch.rand(64, dtype=BF16) + 0.5
    w_gate_up, w_down = _weights((256, 64), (64, 128), seed=1)

    def block(x, delta, norm_w, w_gate_up, w_down):
        h = x + delta
        gate, up = F.linear(_rms_norm(h, norm_w), w_gate_up).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, w_down)

    gm, fused = _fused(block, torch.randn(1, 64, dtype=BF16), torch.randn(1, 64, dtype=BF16), norm_w, w_gate_up,
                       w_down)
    assert fused == [("add", "silu", 1e-6)]
    x, delta = torch.randn(7, 64, dtype=BF16), torch.randn(7, 64, dtype=BF16)
    _close(gm(x, delta, norm_w, w_gate_up, w_down), block(x, delta, norm_w, w_gate_up, w_down))


def test_the_rotary_embedding_of_q_and_k_joins_the_fused_qkv_matmul():
    """vgc's Llama spelling (`_rotate`: NeoX halves, cos/sin of [T, D/2]): skinny_matmul_rope hands the tables to
    the fused op, and q and k read its product; v and the sum are untouched. Traced with a symbolic token count and
    run at one row (the kernel's path where Triton runs) and three (the parts)."""
    from vgc.models.llama import _rotate
    from vgc.passes.skinny_fusion import fuse_rotary

    def inputs(rows):
        angles = torch.rand(rows, 8) * 6.3
        return (torch.randn(rows, 64, dtype=BF16), torch.randn(rows, 64, dtype=BF16), norm_w, w_qkv, angles.cos(),
                angles.sin())

    norm_w = torch.rand(64, dtype=BF16) + 0.5
    (w_qkv,) = _weights((128, 64))

    def qkv(x, delta, norm_w, w_qkv, cos, sin):
        h = x + delta
        q, k, v = F.linear(_rms_norm(h, norm_w), w_qkv).split([64, 32, 32], dim=-1)
        return (h, _rotate(q.unflatten(-1, (4, 16)), cos, sin), _rotate(k.unflatten(-1, (2, 16)), cos, sin),
                v.unflatten(-1, (2, 16)))

    gm, fused = _fused(qkv, *inputs(3), tracing_mode="symbolic")
    assert fused == [("add", 1e-6)]
    assert fuse_rotary(gm.graph) == 1
    gm.recompile()
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.vgc.skinny_mm_add_fused.default]
    assert [getattr(a, "name", a) for a in node.args[6:]] == ["cos_1", "sin_1", 96, 16]
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.cat.default not in ops and torch.ops.aten.sub.Tensor not in ops   # no rotation left
    for rows in (1, 3):
        args = inputs(rows)
        for got, want in zip(gm(*args), qkv(*args)):
            assert got.shape == want.shape
            _close(got, want)


def test_a_rotation_by_other_tables_for_q_and_k_is_left_to_inductor():
    from vgc.models.llama import _rotate
    from vgc.passes.skinny_fusion import fuse_rotary

    x = torch.randn(1, 64, dtype=BF16)
    norm_w = torch.rand(64, dtype=BF16) + 0.5
    (w_qkv,) = _weights((128, 64))
    cos, sin, other = torch.rand(1, 8), torch.rand(1, 8), torch.rand(1, 8)

    def qkv(x, norm_w, w_qkv, cos, sin, other):
        q, k, v = F.linear(_rms_norm(x, norm_w), w_qkv).split([64, 32, 32], dim=-1)
        return _rotate(q.unflatten(-1, (4, 16)), cos, sin), _rotate(k.unflatten(-1, (2, 16)), cos, other), v

    gm, fused = _fused(qkv, x, norm_w, w_qkv, cos, sin, other)
    assert fused == [(1e-6,)] and fuse_rotary(gm.graph) == 0


def _transformers_qkv(rows, batch=1, seed=3):
    """A transformers Llama layer's attention input half, as the integration's flat batch traces it: the residual
    add, RMSNorm, one fused qkv linear (vgc's sibling fusion), q/k/v as slices viewed as [B, T, H, D] heads and
    transposed, q and k rotated by transformers' own `apply_rotary_pos_emb` with full-width tables."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    norm_w = torch.rand(64, dtype=BF16) + 0.5
    (w_qkv,) = _weights((128, 64), seed=seed)

    def qkv(x, delta, norm_w, w_qkv, cos, sin):
        h = x + delta
        both = F.linear(_rms_norm(h, norm_w, weight_first=True), w_qkv)
        shape = (*h.shape[:-1], -1, 16)
        q, k, v = (both[..., a:b].view(shape).transpose(1, 2) for a, b in ((0, 64), (64, 96), (96, 128)))
        q, k = llama.apply_rotary_pos_emb(q, k, cos, sin)
        return h, q, k, v

    def inputs(tokens, table_batch=batch):
        gen = torch.Generator().manual_seed(tokens)
        # independent angles for the two halves of a head: the kernel must turn each column by its own value
        angles = torch.rand(table_batch, tokens, 16, generator=gen) * 6.3
        return (torch.randn(batch, tokens, 64, dtype=BF16, generator=gen),
                torch.randn(batch, tokens, 64, dtype=BF16, generator=gen), norm_w, w_qkv, angles.cos().to(BF16),
                angles.sin().to(BF16))

    return qkv, inputs


def test_transformers_rotary_embedding_and_symbolic_residual_sum_join_the_fused_qkv_matmul():
    """transformers' spelling (`q * cos + rotate_half(q) * sin` over [B, H, T, D] heads, [B, T, D] tables whose
    halves the graph cannot show equal) traced with a symbolic token count, as the integration's pieces are: the
    sum, the norm, the product and both rotations become one `vgc::skinny_mm_add_fused`, and the result equals the
    unfused function at one row (the fused kernel where Triton runs) and three (the parts)."""
    from vgc.passes.skinny_fusion import fuse_rotary

    qkv, inputs = _transformers_qkv(3)
    gm, fused = _fused(qkv, *inputs(3), dynamic={0: {1}, 1: {1}, 4: {1}, 5: {1}})
    assert fused == [("add", 1e-6)]   # the sum reshaped back to [1, T, 64] by the graph's own size node
    assert fuse_rotary(gm.graph) == 1
    gm.recompile()
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.vgc.skinny_mm_add_fused.default]
    assert node.args[8:] == (96, 16)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.cat.default not in ops and torch.ops.aten.neg.default not in ops
    assert torch.ops.aten.add.Tensor not in ops   # the residual add is the fused op's too
    for rows in (1, 3):
        args = inputs(rows)
        for got, want in zip(gm(*args), qkv(*args)):
            assert got.shape == want.shape
            _close(got, want)


def test_transformers_rotation_by_tables_broadcast_over_the_batch_is_left_to_inductor():
    """Two sequences of a [B, T] batch rotated by one [1, T, D] table: a row of the product has no row of the
    table of its own, so the rotation stays Inductor's (the norm and sum still fuse)."""
    from vgc.passes.skinny_fusion import fuse_rotary

    qkv, inputs = _transformers_qkv(3, batch=2)
    args = inputs(3, table_batch=1)
    gm, fused = _fused(qkv, *args, dynamic={0: {1}, 1: {1}, 4: {1}, 5: {1}})
    assert fused == [("add", 1e-6)] and fuse_rotary(gm.graph) == 0
    gm.recompile()
    for got, want in zip(gm(*args), qkv(*args)):
        _close(got, want)


def test_slices_with_symbolic_or_default_bounds_are_not_taken_for_column_ranges():
    """A slice whose bound is a graph value (or left out) must not crash the matcher; only constant ranges of the
    last dim count as q, k, gate or up."""
    from vgc.passes.skinny_fusion import _column_parts

    graph = torch.fx.Graph()
    y = graph.placeholder("y")
    y.meta["val"] = torch.empty(2, 8)
    n = graph.placeholder("n")
    graph.call_function(torch.ops.aten.slice.Tensor, (y, -1, 0, n))
    assert _column_parts(y, 8) is None
    graph = torch.fx.Graph()
    y = graph.placeholder("y")
    y.meta["val"] = torch.empty(2, 8)
    first = graph.call_function(torch.ops.aten.slice.Tensor, (y, -1, 0, 4))
    rest = graph.call_function(torch.ops.aten.slice.Tensor, (y, 1, 4))   # end left out: to the end
    assert _column_parts(y, 8) == {0: (4, first), 4: (8, rest)}
