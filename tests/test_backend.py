"""The core backend on CPU with real Inductor: splitting, per-piece compiles, dedup, equality with eager."""

import dataclasses
import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vgc
from vgc.models import llama
from conftest import FP32_TOL, MLP, assert_matches_eager


def test_dropin_tiny_decoder_equals_eager(tiny, fresh_counters):
    cfg, model = tiny
    assert_matches_eager(cfg, model, torch.compile(model, backend="vgc"), sizes=(1, 3, 17, 64))
    assert fresh_counters.dynamo_traces >= 1
    assert fresh_counters.inductor_compiles >= 3


def test_compiled_run_writes_the_same_kv_cache_as_eager(tiny, fresh_counters, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model)
    eager_batch, compiled_batch = llama.make_batch(cfg, 24, "prefill"), llama.make_batch(cfg, 24, "prefill")
    with torch.no_grad():
        model(**eager_batch)
        compiled(**compiled_batch)
    for eager_cache, compiled_cache in zip(eager_batch["kv_caches"], compiled_batch["kv_caches"]):
        torch.testing.assert_close(compiled_cache, eager_cache, **FP32_TOL)


@pytest.mark.parametrize("num_layers", [4])
def test_l_layer_decoder_gives_2l_plus_1_pieces_and_3_unique(num_layers, fresh_counters, no_cache):
    cfg = dataclasses.replace(llama.tiny_config(), num_layers=num_layers)
    model = llama.Llama(cfg)
    compiled = vgc.compile(model)
    with torch.no_grad():
        out = compiled(**llama.make_batch(cfg, 16, "prefill"))
        torch.testing.assert_close(out, model(**llama.make_batch(cfg, 16, "prefill")), **FP32_TOL)
    graph = compiled.backend.graphs[0]
    assert len(graph.pieces) == 2 * num_layers + 1
    assert sum(p.is_splitting for p in graph.pieces) == num_layers
    assert fresh_counters.pieces == 2 * num_layers + 1
    assert fresh_counters.unique_pieces <= 3
    assert len(graph.unique_keys) <= 3
    # identical middle layers share one compiled artifact: Inductor ran once per unique piece
    assert fresh_counters.inductor_compiles == len(graph.unique_keys)
    middle = [graph.compiled[p.name] for p in graph.pieces if not p.is_splitting][1:-1]
    assert len({id(piece.dynamic_fn) for piece in middle}) == 1


def test_model_without_attention_is_one_compiled_piece(fresh_counters, no_cache):
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend="vgc")
    x = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert fresh_counters.pieces == 1
    assert fresh_counters.splitting_pieces == 0
    assert fresh_counters.inductor_compiles == 1


class ShapeRecorder(torch._inductor.custom_graph_pass.CustomGraphPass):
    """An Inductor post-grad pass that records the first input shape of every graph it is run on."""

    def __init__(self, name):
        self.name, self.shapes = name, []

    def __call__(self, graph):
        first = next(n for n in graph.nodes if n.op == "placeholder")
        self.shapes.append(tuple(first.meta["val"].shape))

    def uuid(self):
        return self.name


def test_compile_sizes_inductor_config_applies_to_static_artifacts_only(fresh_counters, no_cache):
    everywhere, static_only = ShapeRecorder("everywhere"), ShapeRecorder("static-only")
    # the post-grad slot is the user's only while no vgc pass runs there (skinny_matmuls and outer_products do by
    # default)
    config = vgc.CompilationConfig(compile_sizes=[8], pass_config={"skinny_matmuls": False, "outer_products": False},
                                   inductor_compile_config={"post_grad_custom_post_pass": everywhere},
                                   compile_sizes_inductor_config={"post_grad_custom_pre_pass": static_only})
    torch.manual_seed(0)
    model = MLP()
    compiled = vgc.compile(model, config=config)
    compiled.warmup(lambda n: (torch.randn(n, 32),))
    assert fresh_counters.inductor_compiles == 2
    assert static_only.shapes == [(8, 32)]                      # the size-8 artifact only
    assert len(everywhere.shapes) == 2 and (8, 32) in everywhere.shapes   # the symbolic one too
    x = torch.randn(8, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    with pytest.raises(ValueError, match="compile_sizes_inductor_config: unknown Inductor option 'max_autotun'"):
        vgc.CompilationConfig(compile_sizes_inductor_config={"max_autotun": True})


class SDPABlock(nn.Module):
    """A plain transformer block using F.scaled_dot_product_attention, as user code would."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class SDPAModel(nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.blocks = nn.ModuleList(SDPABlock() for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_split_at_aten_sdpa_in_plain_transformer(fresh_counters, no_cache):
    torch.manual_seed(0)
    model = SDPAModel(layers=3).eval()
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=["aten::scaled_dot_product_attention"]))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in ((2, 7, 32), (3, 5, 32)):
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    graph = backend.graphs[0]
    assert len(graph.pieces) == 7
    assert [p.is_splitting for p in graph.pieces] == [False, True] * 3 + [False]
    assert len(graph.unique_keys) <= 3


def test_graph_break_gives_two_split_graphs(fresh_counters, no_cache):
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = MLP(), MLP()

        def forward(self, x):
            x = self.a(x)
            torch._dynamo.graph_break()
            return self.b(x)

    torch.manual_seed(0)
    model = Broken()
    backend = vgc.VgcBackend()
    x = torch.randn(4, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x), **FP32_TOL)
    assert len(backend.graphs) == 2
    # the two halves are the same computation: compiled once
    assert fresh_counters.inductor_compiles == 1


def test_bad_option_value_names_key_and_accepted_values(no_cache):
    compiled = torch.compile(MLP(), backend="vgc", options={"cudagraph_mode": "sideways"})
    with pytest.raises(ValueError, match="cudagraph_mode") as info:
        compiled(torch.randn(2, 32))
    for accepted in ("'none'", "'piecewise'", "'full'", "'full_and_piecewise'"):
        assert accepted in str(info.value)


def test_unknown_option_key_is_rejected(no_cache):
    compiled = torch.compile(MLP(), backend="vgc", options={"compile_size": [4]})
    with pytest.raises(ValueError, match="compile_size.*accepted options"):
        compiled(torch.randn(2, 32))


def test_entry_point_resolves_vgc_without_import(tmp_path):
    names = importlib.metadata.entry_points(group="torch_dynamo_backends").names
    assert "vgc" in names, "vgc is not installed: run `pip install -e .` (the README's test command does)"
    script = textwrap.dedent("""
        import sys, torch
        assert "vgc" not in sys.modules
        f = torch.compile(lambda x: torch.sin(x) * 2, backend="vgc")
        x = torch.randn(8)
        out = f(x)
        torch.testing.assert_close(out, torch.sin(x) * 2)
        print("backend", type(torch._dynamo.lookup_backend("vgc")).__name__, "imported", "vgc" in sys.modules)
    """)
    # Run from an empty directory, so vgc comes from the installed package, not the working tree.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imported True" in proc.stdout


def test_eager_pieces_call_custom_op_bodies_directly(tiny, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model)
    with torch.no_grad():
        out = compiled(**llama.make_batch(cfg, 6, "decode"))
    torch.testing.assert_close(out, model(**llama.make_batch(cfg, 6, "decode")), **FP32_TOL)
    attention_piece = next(p for p in compiled.backend.graphs[0].pieces if p.is_splitting)
    assert "torch.ops.vgc.attention" not in attention_piece.module.code


def test_ops_with_device_kernels_keep_the_dispatcher():
    from vgc._compat import direct_kernel

    @torch.library.custom_op("vgc_test::scaled", mutates_args=())
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert direct_kernel(torch.ops.vgc_test.scaled.default) is not None

    @torch.library.custom_op("vgc_test::per_device", mutates_args=())
    def per_device(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    per_device.register_kernel("cpu")(lambda x: x * 3)
    assert direct_kernel(torch.ops.vgc_test.per_device.default) is None
    assert direct_kernel(torch.ops.aten.add.Tensor) is None


def _sdpa(q, k=None, v=None):
    k = q if k is None else k
    v = q if v is None else v
    return F.scaled_dot_product_attention(q[None], k[None], v[None])[0]


class ViewAfterMutation(nn.Module):
    def forward(self, q, cache):
        sel = cache[0]           # a view: it must see the in-place update below
        cache.add_(100.0)
        return _sdpa(sel)


class CopyBeforeMutation(nn.Module):
    def forward(self, q, cache, idx):
        sel = cache[idx]         # tensor indexing copies: it must not see the update
        cache.add_(100.0)
        return _sdpa(q * 2, sel, sel)


class TensorIndexedAttention(nn.Module):
    def forward(self, q):
        a = _sdpa(q)
        return a[torch.arange(4) * 2] + 1


class ViewsTakenUpFront(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0, self.l1 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, kv):
        k0, v0, k1, v1 = kv[0, 0], kv[0, 1], kv[1, 0], kv[1, 1]
        h = _sdpa(self.l0(x), k0, v0)
        return _sdpa(self.l1(h), k1, v1) * 2


@pytest.mark.parametrize("model, make_args", [
    (ViewAfterMutation, lambda: (torch.randn(8, 8), torch.randn(2, 8, 8))),
    (CopyBeforeMutation, lambda: (torch.randn(8, 8), torch.randn(16, 8), torch.arange(8))),
    (TensorIndexedAttention, lambda: (torch.randn(8, 8),)),
    (ViewsTakenUpFront, lambda: (torch.randn(8, 8), torch.randn(2, 2, 8, 8))),
], ids=["view-after-mutation", "copy-before-mutation", "tensor-indexed-output", "views-up-front"])
def test_split_keeps_order_and_aliasing(model, make_args, no_cache):
    torch.manual_seed(0)
    module = model()
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=["aten::scaled_dot_product_attention"]))
    args = make_args()
    eager_args = [a.clone() for a in args]
    with torch.no_grad():
        out = torch.compile(module, backend=backend)(*args)
        torch.testing.assert_close(out, module(*eager_args), **FP32_TOL)
    for got, want in zip(args, eager_args):   # in-place updates of inputs happened exactly as in eager
        torch.testing.assert_close(got, want, **FP32_TOL)
    assert any(p.is_splitting for p in backend.graphs[0].pieces)
