"""Graph passes: the pass manager inside Inductor, vgc's built-in passes, the user's passes and their identity."""

import uuid as uuid_module

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import vgc
from vgc import _compat
from vgc.passes import BUILTIN_PASSES
from vgc.passes.manager import PassManager, pass_manager
from vgc.passes.noop import eliminate_noops
from vgc.passes.outer_product import options as outer_products_options, rewrite_outer_products
from conftest import FP32_TOL, MLP, SiblingBlock

aten = torch.ops.aten


def test_noop_elimination_removes_same_shape_views_slices_and_expands():
    def f(x, y):
        a = x.view(x.shape) + 1
        b = a[:, :] * 2                       # a full slice: the same tensor
        c = b.expand(b.shape).reshape(4, 8)   # same shape twice
        return c.view(8, 4) + y + a[1:, :].sum()   # a real reshape and a real slice stay

    x, y = torch.randn(4, 8), torch.randn(8, 4)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    ops = lambda: [n.target for n in gm.graph.nodes if n.op == "call_function"]   # noqa: E731
    before = ops()
    assert eliminate_noops(gm.graph) == 4
    gm.recompile()
    after = ops()
    assert len(before) - len(after) == 4
    assert after.count(torch.ops.aten.view.default) == 1 and after.count(torch.ops.aten.slice.Tensor) == 1
    torch.testing.assert_close(gm(x, y), f(x, y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmuls_with_an_inner_dim_of_one_become_the_same_multiplies(dtype):
    def f(freq, pos, a, b):
        angles = freq[None, :, None].expand(3, -1, 1) @ pos[:, None, :]   # transformers' rotary spelling: bmm
        outer = a[:, :1] @ b[:1, :]                                         # mm, K = 1
        return angles.cos(), outer, a @ b                                   # K = 4 stays a matmul

    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(*shape, generator=gen).to(dtype) * 50 for shape in ((8,), (3, 5), (6, 4), (4, 7))]
    gm = make_fx(f, tracing_mode="fake")(*args)
    matmuls = lambda: [n.target for n in gm.graph.nodes if n.target in (aten.mm.default, aten.bmm.default)]  # noqa: E731
    assert matmuls() == [aten.bmm.default, aten.mm.default, aten.mm.default]
    assert rewrite_outer_products(gm.graph) == 2
    gm.recompile()
    assert matmuls() == [aten.mm.default]
    # one rounding of one product either way: the same bits, not merely close
    for got, want in zip(gm(*args), f(*args)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_fp32_outer_products_stay_matmuls_where_matmuls_round_fp32_inputs():
    def f(a, b):
        return a @ b

    gm = make_fx(f, tracing_mode="fake")(torch.randn(6, 1), torch.randn(1, 4))
    untouched = outer_products_options()
    assert not _compat.reduced_fp32_matmuls("cuda") and not _compat.reduced_fp32_matmuls("cpu")
    before = torch.get_float32_matmul_precision()   # one API to set and restore: torch warns on mixed ones
    torch.set_float32_matmul_precision("high")   # TF32 for cuBLAS and oneDNN alike
    try:
        assert _compat.reduced_fp32_matmuls("cuda") and _compat.reduced_fp32_matmuls("cpu")
        assert rewrite_outer_products(gm.graph) == 0   # the matmul would round the inputs to TF32 first
        assert outer_products_options() != untouched   # so the setting is part of the pass's cache identity
    finally:
        torch.set_float32_matmul_precision(before)
    mkldnn = torch.backends.mkldnn.matmul
    kept = mkldnn.fp32_precision
    mkldnn.fp32_precision = "bf16"   # the CPU's own reduced mode, CUDA's untouched
    try:
        assert _compat.reduced_fp32_matmuls("cpu") and not _compat.reduced_fp32_matmuls("cuda")
        assert rewrite_outer_products(gm.graph) == 0
    finally:
        mkldnn.fp32_precision = kept
    bf16 = make_fx(f, tracing_mode="fake")(torch.randn(6, 1, dtype=torch.bfloat16),
                                           torch.randn(1, 4, dtype=torch.bfloat16))
    assert rewrite_outer_products(bf16.graph) == 1
    assert rewrite_outer_products(gm.graph) == 1   # exact again


class CountingPass(_compat.CustomGraphPass):
    """A user's pass: counts the graphs it sees and the nodes in them; `token` makes its uuid (and so the cache
    entries Inductor and vgc keep for it) unique to one test."""

    def __init__(self, token: str, fail: bool = False):
        self.token, self.fail, self.graphs = token, fail, []

    def __call__(self, graph):
        if self.fail:
            raise ValueError("this pass always fails")
        self.graphs.append(len(graph.nodes))

    def uuid(self):
        return f"counting-pass-{self.token}"


def test_a_user_pass_runs_on_every_compiled_piece(no_cache, fresh_counters):
    user_pass = CountingPass(uuid_module.uuid4().hex)
    model = MLP().eval()
    compiled = torch.compile(model, backend="vgc", options={"inductor_passes": {"count": user_pass},
                                                            "compile_sizes": [4]})
    with torch.no_grad():
        x = torch.randn(4, 32)
        torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert len(user_pass.graphs) == fresh_counters.inductor_compiles == 1   # one static graph at the first call


def test_passes_enter_the_cache_hash_by_identity():
    def config(**kw):
        return vgc.CompilationConfig(**kw)

    base = config().compute_hash()
    first, edited = CountingPass("v1"), CountingPass("v2")
    assert config(inductor_passes={"p": first}).compute_hash() != base
    assert config(inductor_passes={"p": first}).compute_hash() == config(inductor_passes={"p": CountingPass("v1")}) \
        .compute_hash()   # the same pass in another object: the same entry
    assert config(inductor_passes={"p": edited}).compute_hash() != config(inductor_passes={"p": first}).compute_hash()
    assert config(pass_config={"eliminate_noops": True}).compute_hash() != base
    # Inductor's own cache sees the manager's uuid, which follows each pass's
    assert pass_manager({}, {"p": first}).uuid() != pass_manager({}, {"p": edited}).uuid()
    assert repr(pass_manager({}, {"p": first})) == repr(pass_manager({}, {"p": CountingPass("v1")}))
    assert pass_manager({"eliminate_noops": False}, {}) is None


def test_a_pass_that_raises_is_named(no_cache):
    model = MLP().eval()
    compiled = torch.compile(model, backend="vgc", options={
        "inductor_passes": {"boom": CountingPass(uuid_module.uuid4().hex, fail=True)}})
    with pytest.raises(Exception, match="graph pass 'boom' failed .*this pass always fails"), torch.no_grad():
        compiled(torch.randn(4, 32))


def test_pass_settings_are_checked():
    with pytest.raises(ValueError, match=r"unknown graph pass\(es\) \['fuse_everything'\]"):
        vgc.CompilationConfig(pass_config={"fuse_everything": True})
    with pytest.raises(ValueError, match="must be True or False"):
        vgc.CompilationConfig(pass_config={"eliminate_noops": "yes"})
    with pytest.raises(ValueError, match=r"inductor_passes\['plain'\] must be a torch CustomGraphPass or a callable "
                                         r"with a uuid\(\)"):
        vgc.CompilationConfig(inductor_passes={"plain": lambda graph: None})
    with pytest.raises(ValueError, match="put that pass in inductor_passes"):
        vgc.CompilationConfig(inductor_passes={"p": CountingPass("x")},
                              inductor_compile_config={"post_grad_custom_post_pass": CountingPass("y")})
    assert vgc.CompilationConfig().pass_config == {name: p.default for name, p in BUILTIN_PASSES.items()}


def test_debug_dump_path_gets_each_graph_before_and_after_each_pass(no_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("VGC_DEBUG_DUMP_PATH", str(tmp_path))
    model = MLP().eval()
    compiled = torch.compile(model, backend="vgc", options={
        "pass_config": {"eliminate_noops": True}, "inductor_passes": {"count": CountingPass(uuid_module.uuid4().hex)}})
    with torch.no_grad():
        x = torch.randn(3, 32)
        torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    names = sorted(p.name for p in tmp_path.iterdir())   # piece-<graph>-<step>-<before|after>-<pass>.py
    assert {name.split("-", 2)[2] for name in names} == {
        "00-before-eliminate_noops.py", "00-after-eliminate_noops.py", "01-before-outer_products.py",
        "01-after-outer_products.py", "02-before-skinny_matmuls.py", "02-after-skinny_matmuls.py",
        "03-before-skinny_matmul_fusion.py", "03-after-skinny_matmul_fusion.py", "04-before-skinny_matmul_rope.py",
        "04-after-skinny_matmul_rope.py", "05-before-count.py", "05-after-count.py"}
    assert "torch.ops.aten" in (tmp_path / names[0]).read_text()


def test_the_tiny_decoder_with_every_pass_equals_eager(tiny, no_cache):
    from conftest import assert_matches_eager

    cfg, model = tiny
    on = {name: True for name in BUILTIN_PASSES}
    compiled = torch.compile(model, backend="vgc", options={"pass_config": on})
    assert_matches_eager(cfg, model, compiled, sizes=(1, 5, 16))


class _Angles(torch.nn.Module):
    """Positions times frequencies as a matmul of inner dim 1, too large for Inductor's own CPU decomposition of such
    an `mm` (which takes only 32 elements or fewer), then cos and sin as rotary embeddings take them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)))

    def forward(self, positions):
        angles = positions.float()[:, None] @ self.inv_freq[None, :]
        return angles * 1.0, angles.cos()


def test_the_outer_products_pass_gives_eagers_bits_inside_inductor(no_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("VGC_DEBUG_DUMP_PATH", str(tmp_path))
    model = _Angles().eval()
    compiled = torch.compile(model, backend="vgc", options={"inductor_compile_config": {"fx_graph_cache": False}})
    positions = torch.arange(40) * 37
    with torch.no_grad():
        (angles, cos), (want_angles, want_cos) = compiled(positions), model(positions)
    assert torch.equal(angles, want_angles)   # one rounding of one product, as sgemm gives it
    torch.testing.assert_close(cos, want_cos, rtol=1e-6, atol=1e-6)
    (before,) = [p.read_text() for p in tmp_path.glob("*-before-outer_products.py")]
    (after,) = [p.read_text() for p in tmp_path.glob("*-after-outer_products.py")]
    assert "aten.mm.default" in before and "aten.mm.default" not in after


def test_transformers_rotary_angles_become_a_multiply(no_cache, monkeypatch, tmp_path):
    """An unmodified Hugging Face Llama: its rotary angles (`inv_freq @ position_ids`, fp32, K = 1) are no matmul
    in the piece that computes them; the output stays eager's."""
    pytest.importorskip("transformers")
    from conftest import hf_llama

    monkeypatch.setenv("VGC_DEBUG_DUMP_PATH", str(tmp_path))
    model = hf_llama(num_hidden_layers=1)
    compiled = torch.compile(model, backend="vgc", options={"splitting_ops": SDPA})
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state,
                                   **FP32_TOL)
    # torch 2.13 on decomposes it itself; on 2.11 and 2.12 the pass does (the test above covers the pass alone)
    after = [p.read_text() for p in tmp_path.glob("*-after-outer_products.py")]
    assert after and not any("aten.bmm.default" in text for text in after)
    assert any("aten.cos.default" in text for text in after)   # the angles are computed in a compiled piece


def test_the_manager_is_a_torch_custom_graph_pass():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    assert issubclass(PassManager, CustomGraphPass)


SDPA = ["aten::scaled_dot_product_attention"]


def _linears(module):
    return [n for n in module.graph.nodes if n.op == "call_function" and "linear" in str(n.target)]


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


@pytest.mark.extended
def test_sibling_linears_fuse_on_an_unmodified_hugging_face_llama(no_cache, fresh_counters, caplog):
    pytest.importorskip("transformers")
    from conftest import hf_llama

    model = hf_llama(num_hidden_layers=2)
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=SDPA, pass_config={"fuse_sibling_matmuls": True}))
    compiled = torch.compile(model, backend=backend)

    def check(*shape):
        ids = torch.randint(0, 128, shape)
        with torch.no_grad():
            torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state,
                                       model(input_ids=ids).last_hidden_state, **FP32_TOL)

    check(1, 16)
    pieces = [p.module for p in backend.graphs[0].pieces if not p.is_splitting]
    # Per layer, 7 linears (q, k, v, o, gate, up, down) become 4: q/k/v one, gate/up one.
    assert sum(len(_linears(m)) for m in pieces) == 2 * 4
    widths = sorted(sum(1 for user in n.users if user.target is torch.narrow) for m in pieces for n in _linears(m))
    assert widths == [0, 0, 0, 0, 2, 2, 3, 3]   # one matmul where there were three (and two)
    # One copy of the weights: q, k and v are rows of one storage of exactly their size, with their values.
    attention = model.layers[1].self_attn
    parts = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]
    assert len({_storage(p) for p in parts}) == 1
    assert parts[0].untyped_storage().nbytes() == sum(p.numel() * p.element_size() for p in parts)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, original[name], rtol=0, atol=0)

    check(2, 9)   # another shape: Dynamo compiles again, the weights are already laid out
    assert len(backend.graphs) == 2 and _storage(attention.q_proj.weight) == _storage(parts[2])

    # In-place updates reach the fused rows.
    with torch.no_grad():
        model.load_state_dict({name: 2 * value for name, value in original.items()})
    check(2, 9)
    # A replaced parameter: correct, with one warning naming the fix.
    attention.k_proj.weight = torch.nn.Parameter(torch.randn_like(attention.k_proj.weight), requires_grad=False)
    with caplog.at_level("WARNING", logger="vgc"):
        check(2, 9)
        check(2, 9)
    assert sum("no longer lie together" in r.message for r in caplog.records) == 1


def test_fused_linears_with_biases_load_from_a_saved_trace(tmp_path, monkeypatch):
    """vgc.compile saves the split graph with its `fused_weight` calls; a second model loads it with no trace and
    no Inductor call, and its own weights are fused at its first call."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path))
    config = vgc.CompilationConfig(splitting_ops=SDPA, pass_config={"fuse_sibling_matmuls": True}, compile_sizes=[4])
    inputs = lambda n: (torch.randn(n, 16),)   # noqa: E731
    first = vgc.compile(SiblingBlock().eval(), config=config)
    first.warmup(inputs)
    assert first.trace_source == "traced"
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, traces_loaded=1):
        model = SiblingBlock().eval()
        second = vgc.compile(model, config=config)
        second.warmup(inputs)
    assert second.trace_source == "saved"
    assert _storage(model.q.weight) == _storage(model.v.weight) and _storage(model.q.bias) == _storage(model.k.bias)
    assert _storage(model.gate.weight) == _storage(model.up.weight)
    with torch.no_grad():
        for n in (1, 4, 7):
            x = torch.randn(n, 16)
            torch.testing.assert_close(second(x), SiblingBlock().eval()(x), **FP32_TOL)


class Flattening(torch.nn.Module):
    """Sibling linears whose outputs are flattened: a column slice of a wider output cannot be viewed flat."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x).view(-1) * 2 + self.b(x).view(-1)


class WrittenBetween(torch.nn.Module):
    """Sibling linears with an in-place write to their input between them: one matmul would read it too early."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        h = x + 1
        a = self.a(h)
        h.mul_(2)
        return a + self.b(h)


@pytest.mark.parametrize("model_class", [Flattening, WrittenBetween])
def test_a_piece_the_fusion_would_break_keeps_its_linears(model_class, no_cache):
    model = model_class().eval()
    backend = vgc.VgcBackend(vgc.CompilationConfig(pass_config={"fuse_sibling_matmuls": True}))
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert len(_linears(backend.graphs[0].pieces[0].module)) == 2
    assert _storage(model.a.weight) != _storage(model.b.weight)
