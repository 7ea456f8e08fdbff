"""What vgc tells a user about their model: splitting ops that cannot or do not match, compile progress, and
gradients (vgc compiles for inference)."""

import logging

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import vgc
import vgc.backend
from conftest import FP32_TOL, MLP
from vgc.piecewise.split import check_splitting_ops

NO_SPLIT = "no splitting op of"


class SelfAttention(torch.nn.Module):
    """One attention block written the way users write it: `F.scaled_dot_product_attention`, no vgc op."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(batch, tokens, dim))


def _vgc_messages(caplog, text):
    return [r.getMessage() for r in caplog.records if r.name == "vgc" and text in r.getMessage()]


def test_unknown_splitting_op_is_an_error_before_any_compile(fresh_counters, no_cache):
    compiled = torch.compile(SelfAttention(), backend="vgc",
                             options={"splitting_ops": ["aten::scaled_dot_product_atention"]})
    with pytest.raises(ValueError, match=r"'aten::scaled_dot_product_atention' is not an operator torch knows "
                                         r"\(did you mean 'aten::scaled_dot_product_attention'"), torch.no_grad():
        compiled(torch.randn(1, 4, 16))
    assert fresh_counters.inductor_compiles == 0


def test_splitting_op_names_resolve_like_torch_ops():
    gm = fx.symbolic_trace(SelfAttention())
    # Real operators pass even when Dynamo graphs never hold them (the flash kernel is chosen below SDPA):
    # the graph then runs as one piece, and the INFO line says what to split at instead.
    check_splitting_ops(["vgc::attention", "aten::_scaled_dot_product_flash_attention", "aten::mm.default"], gm)
    with pytest.raises(ValueError, match=r"'vgc::atention' .*did you mean 'vgc::attention'"):
        check_splitting_ops(["vgc::atention"], gm)
    with pytest.raises(ValueError, match=r"'aten::mm\.nope' .*'aten::mm\.out'"):
        check_splitting_ops(["aten::mm.nope"], gm)
    with pytest.raises(ValueError, match=r"'mylib::attn' is not an operator torch knows; .*import the module"):
        check_splitting_ops(["mylib::attn"], gm)


def test_sdpa_model_with_default_splitting_ops_says_which_op_splits_it(fresh_counters, no_cache, caplog, capsys,
                                                                      monkeypatch):
    caplog.set_level(logging.INFO, logger="vgc")
    monkeypatch.setattr(vgc.log, "PROGRESS_DELAY_S", 0.0)   # show the bar at once: it must not disturb
    torch.manual_seed(0)
    model = SelfAttention()
    backend = vgc.VgcBackend()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x), **FP32_TOL)
    assert _vgc_messages(caplog, NO_SPLIT) == [
        "no splitting op of ['vgc::attention', 'vgc::varlen_attention'] occurs in the graph; it has aten::scaled_dot_product_attention "
        "(x1): pass splitting_ops=['aten::scaled_dot_product_attention'] to split there"]
    assert len(backend.graphs[0].pieces) == 1 and fresh_counters.inductor_compiles == 1
    assert "vgc: graph 0" in capsys.readouterr().err

    # Once per model: the graphs around a graph break would only repeat it.
    backend._explain_unsplit(fx.symbolic_trace(model))
    assert len(_vgc_messages(caplog, NO_SPLIT)) == 1


class CachedAttention(SelfAttention):
    """A decode step the way a hand-written KV cache does it: the new keys and values appended to the past."""

    def forward(self, x, past_k, past_v):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj(y.transpose(1, 2).reshape(batch, tokens, dim))


def test_sdpa_reading_a_kv_cache_is_split_by_default(fresh_counters, no_cache, caplog):
    """More keys than queries: unsplit, the one piece would follow the KV length (no graph on any decode step),
    so the default splitting ops take SDPA there. The queries-are-keys model above stays one piece."""
    caplog.set_level(logging.INFO, logger="vgc")
    torch.manual_seed(0)
    model = CachedAttention()
    backend = vgc.VgcBackend()
    x, past = torch.randn(2, 1, 16), torch.randn(2, 2, 7, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x, past, past + 1), model(x, past, past + 1),
                                   **FP32_TOL)
    pieces = backend.graphs[0].pieces
    assert [p.is_splitting for p in pieces] == [False, True, False], pieces
    assert not _vgc_messages(caplog, NO_SPLIT)


def test_graph_without_attention_says_nothing_at_info(caplog):
    caplog.set_level(logging.DEBUG, logger="vgc")
    vgc.VgcBackend()._explain_unsplit(fx.symbolic_trace(MLP()))
    assert [r.levelno for r in caplog.records if NO_SPLIT in r.getMessage()] == [logging.DEBUG]


class EagerAttention(SelfAttention):
    """Attention written out, as transformers' eager attention does (Gemma2's soft-capping needs it)."""

    def forward(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.tanh(torch.matmul(q, k.transpose(-1, -2)) / 8.0) * 8.0
        y = torch.matmul(scores.softmax(-1), v)
        return x + self.proj(y.transpose(1, 2).reshape(batch, tokens, dim))


class Classifier(MLP):
    def forward(self, x):
        return super().forward(x).softmax(-1)


def test_attention_in_plain_ops_is_said_once_at_warning_with_the_fix(caplog):
    caplog.set_level(logging.DEBUG, logger="vgc")
    backend = vgc.VgcBackend()
    backend._explain_unsplit(fx.symbolic_trace(Classifier()))   # a softmax head is not attention
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for _ in range(2):
        backend._explain_unsplit(fx.symbolic_trace(EagerAttention()))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "attention in plain ops (softmax of q @ k, x1)" in warning and "attn_implementation='sdpa'" in warning


class MLPAndInputView(MLP):
    def forward(self, x):
        return super().forward(x), x[0]


def test_backward_through_vgc_outputs_raises_vgc_error(fresh_counters, no_cache, caplog):
    caplog.set_level(logging.INFO, logger="vgc")
    torch.manual_seed(0)
    model = MLPAndInputView()   # parameters require grad, and no torch.no_grad(): a user who forgot it
    compiled = torch.compile(model, backend=vgc.VgcBackend())
    x = torch.randn(4, 32)
    out = compiled(x)[0]
    torch.testing.assert_close(out.detach(), model(x)[0].detach(), **FP32_TOL)
    assert not _vgc_messages(caplog, NO_SPLIT)
    with pytest.raises(RuntimeError, match="vgc compiles for inference"):
        out.sum().backward()
    # Summed with a term that has gradients, backward would otherwise succeed and leave the model's without.
    with pytest.raises(RuntimeError, match="vgc compiles for inference"):
        (compiled(x)[0].sum() + model.up.weight.sum()).backward()
    with pytest.raises(RuntimeError, match="vgc compiles for inference"):
        torch.autograd.grad(compiled(x)[0].sum(), list(model.parameters()))
    again = compiled(x)[0]
    again += 1   # outputs stay ordinary tensors: in-place writes work as in eager
    torch.testing.assert_close(again.detach(), out.detach() + 1)

    # The artifact is an inference one whatever the grad mode, so the no_grad graph Dynamo makes shares it.
    with fresh_counters.expect(inductor_compiles=0), torch.no_grad():
        plain = compiled(x)[0]
    assert not plain.requires_grad
    torch.testing.assert_close(plain, out.detach())

    # A view of the caller's input stays the caller's: untouched, and writable in place as in eager.
    row = compiled(x)[1]
    assert not row.requires_grad
    row += 1
    torch.testing.assert_close(x[0], row)
