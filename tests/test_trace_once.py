"""`vgc.compile`: one Dynamo trace, guards dropped and replaced by checks, no compile after warm-up."""

import logging

import pytest
import torch
import torch.nn as nn

import vgc
from vgc.models import llama
from conftest import FP32_TOL, assert_matches_eager

SIZES = (1, 2, 3, 8, 64, 100)


@pytest.mark.parametrize("mode", ["backed", "unbacked", "backed_size_oblivious"])
def test_one_trace_and_no_compile_after_warmup(mode, tiny, fresh_counters, dynamo_counters, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model, config=vgc.CompilationConfig(dynamic_shapes_config=mode))
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    assert report["warmed_up"] and report["pieces"] == 5 and report["artifacts_compiled"] >= 3
    with fresh_counters.expect(inductor_compiles=0):
        assert_matches_eager(cfg, model, compiled, SIZES)
    assert fresh_counters.dynamo_traces == 1
    assert dynamo_counters["stats"]["unique_graphs"] == 1
    assert compiled.stats()["dynamic_dims"]["input_ids"] == [0]


def test_unbacked_warmup_at_size_1_does_not_specialise(tiny, fresh_counters, dynamo_counters, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model, config=vgc.CompilationConfig(dynamic_shapes_config="unbacked"))
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode"), trace_size=1)
    assert_matches_eager(cfg, model, compiled, sizes=(2, 3, 17, 100))
    assert fresh_counters.dynamo_traces == 1
    assert dynamo_counters["stats"]["unique_graphs"] == 1


def test_backed_first_call_at_size_1_is_refused(tiny, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model)
    with pytest.raises(ValueError, match="BACKED.*size >= 2"):
        compiled(**llama.make_batch(cfg, 1, "decode"))


def test_compile_sizes_dispatch_to_static_artifacts(tiny, fresh_counters, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model, config=vgc.CompilationConfig(compile_sizes=[8]))
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    # 3 unique pieces, each compiled for the symbolic size and for size 8
    assert report["artifacts_compiled"] == 6
    graph = compiled.backend.graphs[0]
    assert all(sorted(piece.static_fns) == [8] for piece in graph.compiled.values())
    pieces = len(graph.compiled)
    with torch.no_grad():
        for n, static, dynamic in ((8, pieces, 0), (9, 0, pieces)):
            with fresh_counters.expect(static_dispatches=static, dynamic_dispatches=dynamic):
                out = compiled(**llama.make_batch(cfg, n, "decode"))
            torch.testing.assert_close(out, model(**llama.make_batch(cfg, n, "decode")), **FP32_TOL)


def test_mismatched_inputs_raise_clear_errors_without_recompiling(tiny, fresh_counters, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    batch = llama.make_batch(cfg, 4, "decode")
    with fresh_counters.expect(dynamo_traces=0, inductor_compiles=0):
        with pytest.raises(vgc.InputMismatchError, match="'input_ids'.*dtype torch.int32"):
            compiled(**{**batch, "input_ids": batch["input_ids"].int()})
        with pytest.raises(vgc.InputMismatchError, match="'positions'.*device meta"):
            compiled(**{**batch, "positions": batch["positions"].to("meta")})
        with pytest.raises(vgc.InputMismatchError, match="'input_ids'.*rank 2"):
            compiled(**{**batch, "input_ids": batch["input_ids"][None]})
        with pytest.raises(vgc.InputMismatchError, match=r"input_ids.size\(0\) == positions.size\(0\)"):
            compiled(**{**batch, "positions": batch["positions"][:3]})
        with pytest.raises(vgc.InputMismatchError, match="'kv_caches'"):
            compiled(**{**batch, "kv_caches": batch["kv_caches"][:1]})
        strided = torch.stack([batch["positions"], batch["positions"]], dim=1)[:, 0]
        with pytest.raises(vgc.InputMismatchError, match="'positions'.*contiguous"):
            compiled(**{**batch, "positions": strided})


def test_runs_without_autograd_whatever_the_grad_mode(tiny, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model)
    with torch.enable_grad():
        compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
        out = compiled(**llama.make_batch(cfg, 5, "prefill"))
    assert not out.requires_grad


def test_a_model_keeps_its_program_when_dynamo_forgets_its_code(tiny, no_cache):
    """vgc.compile runs the program Dynamo captured ahead of time, not Dynamo's frame cache: losing that cache
    (torch._dynamo.reset()) changes nothing, and nothing compiles."""
    cfg, model = tiny
    compiled = vgc.compile(model)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    assert compiled.trace_source == "traced"
    torch._dynamo.reset()
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0):
        out = compiled(**llama.make_batch(cfg, 5, "prefill"))
    torch.testing.assert_close(out, model(**llama.make_batch(cfg, 5, "prefill")), **FP32_TOL)


class AffineCall:
    """A callable object, not a function: torch cannot save its trace, so vgc traces through Dynamo's entry."""
    def __init__(self):
        self.weight = torch.randn(8)

    def __call__(self, x):
        return x * self.weight + 1


def test_anything_that_would_compile_after_warmup_raises(no_cache):
    model = AffineCall()
    compiled = vgc.compile(model)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert compiled.trace_source == "traced-live"
    torch._dynamo.reset()  # drop Dynamo's compiled code: the next call would have to trace again
    with pytest.raises(vgc.CompileAfterWarmupError):
        compiled(torch.randn(5, 8))


class EqualsFour(nn.Module):
    def forward(self, x):
        if x.shape[0] == 4:   # specialises the dynamic dim: Dynamo rejects the trace
            return x * 2
        return x + 1


def test_a_trace_dynamo_rejects_can_be_retried(no_cache):
    compiled = vgc.compile(EqualsFour())
    with pytest.raises(Exception, match="Constraints violated"):
        compiled(torch.randn(4, 8))
    x = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x), x + 1)   # the retry traces; the rejected graph is not kept
    assert len(compiled.backend.graphs) == 1 and compiled.stats()["model_counters"]["dynamo_traces"] == 2
    with pytest.raises(vgc.InputMismatchError, match="x.size\\(0\\)"):
        compiled(torch.randn(4, 8))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] > 4:
            return self.lin(x) * 2
        return self.lin(x) - 1


@pytest.mark.parametrize("mode", ["backed", "backed_size_oblivious"])
def test_size_branch_is_baked_in_and_checked(mode, caplog, no_cache):
    torch.manual_seed(0)
    model = Branchy()
    compiled = vgc.compile(model, config=vgc.CompilationConfig(dynamic_shapes_config=mode))
    with caplog.at_level(logging.WARNING, logger="vgc"):
        compiled.warmup(lambda n: torch.randn(n, 8), trace_size=16)   # a bare tensor: the one argument
    assert any("holds only when x.size(0) > 4" in r.getMessage() and "if x.shape[0] > 4" in r.getMessage()
               for r in caplog.records)
    with torch.no_grad():
        for n in (5, 9, 100):  # the traced branch serves every size that takes it
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
        with pytest.raises(vgc.InputMismatchError, match=r"x.size\(0\) > 4.*x.size\(0\)=3"):
            compiled(torch.randn(3, 8))


def test_size_branch_under_unbacked_fails_at_trace(no_cache):
    compiled = vgc.compile(Branchy(), config=vgc.CompilationConfig(dynamic_shapes_config="unbacked"))
    with pytest.raises(Exception, match="data-dependent"):
        compiled.warmup(lambda n: (torch.randn(n, 8),))


def test_python_values_and_none_are_checked(no_cache):
    class Scaled(nn.Module):
        def forward(self, x, scale: float = 2.0, bias=None):
            y = x * scale
            return y if bias is None else y + bias

    compiled = vgc.compile(Scaled())
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x, 3.0), x * 3.0)
    torch.testing.assert_close(compiled(torch.ones(7, 3), 3.0), torch.ones(7, 3) * 3.0)
    with pytest.raises(vgc.InputMismatchError, match="'scale' is 2.0 but was 3.0"):
        compiled(x, 2.0)
    with pytest.raises(vgc.InputMismatchError, match="'bias'"):
        compiled(x, 3.0, torch.ones(3))


def test_dynamic_arg_dims_validation(tiny):
    cfg, model = tiny
    with pytest.raises(ValueError, match="unknown argument.*'tokens'"):
        vgc.compile(model, dynamic_arg_dims={"tokens": 0})
    compiled = vgc.compile(model, dynamic_arg_dims={"input_ids": 5})
    with pytest.raises(ValueError, match="dim 5 is out of range"):
        compiled(**llama.make_batch(cfg, 4, "prefill"))


def test_containers_and_kwargs_are_checked_by_value(no_cache):
    class Flexible(nn.Module):
        def forward(self, x, shape: list, items, **kwargs):
            y = x.reshape(shape).sum(-1) * items[1] + items[0].sum()
            return y if "mask" not in kwargs else y * kwargs["mask"]

    compiled = vgc.compile(Flexible(), dynamic_arg_dims={})
    x = torch.arange(24.0)
    items = [torch.ones(2), 2.0]
    torch.testing.assert_close(compiled(x, [4, 6], items), Flexible()(x, [4, 6], items))
    with pytest.raises(vgc.InputMismatchError, match=r"'shape'\[0\] is 6 but was 4"):
        compiled(x, [6, 4], items)
    with pytest.raises(vgc.InputMismatchError, match=r"'items'\[1\] is 5.0 but was 2.0"):
        compiled(x, [4, 6], [torch.ones(2), 5.0])
    with pytest.raises(vgc.InputMismatchError, match=r"'kwargs': keys \['mask'\]"):
        compiled(x, [4, 6], items, mask=torch.zeros(4))


def test_a_call_binds_its_arguments_as_the_signature_does_by_keyword_or_not():
    def forward(x, y=2, *, z=3):
        return x

    def variadic(*args):
        return args

    compiled = vgc.compile(forward)
    for args, kwargs in [((), {"z": 5, "y": 1, "x": 0}), ((0,), {"y": 1, "z": 5}), ((0, 1), {"z": 5})]:
        bound = compiled._bind(args, kwargs)   # the keyword fast path and Signature.bind agree, order included
        assert list(bound.items()) == [("x", 0), ("y", 1), ("z", 5)]
    assert compiled._bind((), {"x": 0}) == {"x": 0, "y": 2, "z": 3}   # defaults filled in
    assert vgc.compile(variadic)._bind((), {}) == {"args": ()}
    with pytest.raises(TypeError):
        compiled._bind((), {"x": 0, "w": 1})
