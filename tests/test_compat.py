"""vgc._compat against the installed torch (no mocks), and the view-op table against torch's real views.

Where a helper has a version-dependent branch, the branch the installed torch takes is tested through the
helper, and the other one where it can be reached without patching torch. Nothing here compiles with Inductor.
"""

import functools
import operator
import re
import tokenize
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import vgc
from vgc import _compat, aliasing
from vgc._compat import graphs as compat_graphs, shapes as compat_shapes
from vgc.aliasing import mutated_inputs
from vgc.piecewise.split import op_names, split_graph


# ---- FX graphs ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, expected", [
    (lambda x: (x + 1, x * 2), True),
    (lambda x: [x + 1], True),
    (lambda x: (x,), True),
    (lambda x: x + 1, False),
    # One node of a multi-output op is already a tuple: unwrapping it to its first item would drop the mean.
    (lambda x: torch.ops.aten.var_mean.correction(x), True),
])
def test_graph_returns_tuple(fn, expected):
    gm = fx.symbolic_trace(fn)
    assert _compat.graph_returns_tuple(gm) is expected


def test_split_module_gives_one_output_pieces_tuple_outputs_where_torch_can():
    from torch.fx.passes.split_module import split_module

    def pieces():
        gm = fx.symbolic_trace(lambda x: (x + 1).relu() * 2)
        ops = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
        return gm, {n: i for i, n in enumerate(ops)}

    gm, partition = pieces()
    split = _compat.split_module(gm, partition)
    x = torch.randn(3)
    torch.testing.assert_close(split(x), (x + 1).relu() * 2)
    accepts_tuple_return = compat_graphs._accepts(split_module, "tuple_return")
    assert _compat.graph_returns_tuple(split.submod_0) is accepts_tuple_return
    # Without `tuple_return` (older torch) a one-output piece returns its value bare: unwrap_single serves both.
    gm, partition = pieces()
    bare = split_module(gm, None, partition.__getitem__, keep_original_order=True)
    assert _compat.graph_returns_tuple(bare.submod_0) is False


def test_qualified_name():
    assert _compat.qualified_name(torch.nn.functional.relu) == "torch.nn.functional.relu"
    assert _compat.qualified_name(torch.Tensor.add) == "torch.Tensor.add"
    assert _compat.qualified_name(functools.partial(print)) is None   # FX cannot name it: no error


def test_custom_op_function_is_the_python_behind_the_operator(monkeypatch):
    import vgc.ops  # noqa: F401  (registers torch.ops.vgc.*)
    from torch._library import custom_ops

    function = _compat.custom_op_function(torch.ops.vgc.causal_attention)
    assert function is not None and _compat.custom_op_function(torch.ops.vgc.causal_attention.default) is function
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    torch.testing.assert_close(function(q, k, k, None, 0.5, None),
                               torch.ops.vgc.causal_attention(q, k, k, None, 0.5, None))
    assert _compat.custom_op_function(torch.ops.aten.add) is None   # not a custom op: the dispatcher's
    assert _compat.custom_op_function(torch.add) is None
    # the other path: torch's private registry gone or changed, so the operator itself is called
    monkeypatch.delattr(custom_ops, "_maybe_get_opdef")
    assert _compat.custom_op_function(torch.ops.vgc.causal_attention) is None


def test_operator_names_and_schema():
    packet, overload = torch.ops.aten.add, torch.ops.aten.add.Tensor
    assert _compat.operator_names(packet) == ("aten::add",)
    assert _compat.operator_names(overload) == ("aten::add", "aten::add.Tensor")
    assert _compat.operator_names(torch.add) == () and _compat.operator_names("add") == ()
    assert _compat.op_schema(overload).name == "aten::add"
    # The packet has no single schema; in-place overloads say which argument they write.
    assert _compat.op_schema(packet) is None and _compat.op_schema(torch.add) is None
    schema = _compat.op_schema(torch.ops.aten.add_.Tensor)
    assert [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments][0]


def test_op_names_of_an_operator_overload():
    (node,) = _nodes(lambda x: torch.ops.aten.relu.default(x))
    assert op_names(node) == ("aten::relu", "aten::relu.default")


# ---- Dynamo and symbolic sizes -----------------------------------------------------------------------------------

def _trace(fn, *args, dynamic=True):
    """Trace `fn` with Dynamo (no duck shaping) and read what vgc reads inside its backend."""
    seen = {}

    def capture(gm, example_inputs):
        fake_mode = _compat.detect_fake_mode(example_inputs)
        seen.update(gm=gm, fake_mode=fake_mode, sources=_compat.symbol_sources(fake_mode),
                    guards=_compat.shape_guards(fake_mode),
                    values=[_compat.traced_value(n) for n in gm.graph.nodes if n.op == "placeholder"],
                    # Dynamo drops this metadata once the backend returns
                    input_names=[_compat.source_name(n.meta["grapharg"].source)
                                 for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    torch._dynamo.reset()
    with _compat.no_duck_shape():
        torch.compile(fn, backend=capture, dynamic=dynamic, fullgraph=True)(*args)
    return seen


def _add_then_branch(x, y):
    out = x + y            # x and y must have equal sizes: one symbol stands for both from here on
    if x.shape[0] > 2:
        out = out * 2
    return out


def test_symbols_sources_and_shape_guards():
    seen = _trace(_add_then_branch, torch.ones(5), torch.ones(5))
    x, y = [v for v in seen["values"] if isinstance(v, torch.Tensor)]
    x_size, y_size = x.shape[0], y.shape[0]
    symbol = _compat.symbolic_expr(y_size)
    # Traced as two symbols, proven equal: both sizes read as the same canonical symbol.
    assert _compat.symbolic_expr(x_size) == symbol
    # Older torch's `.expr` is the symbol as created; applying the replacements (as symbolic_expr does) gives the
    # same canonical one, and applying them again changes nothing.
    shape_env = seen["fake_mode"].shape_env
    assert shape_env.replace(x_size.node._expr) == symbol == shape_env.replace(symbol)
    assert sorted(seen["sources"].values()) == ["L['x'].size()[0]", "L['y'].size()[0]"]
    guards = [(str(expr), origin) for expr, origin in seen["guards"]]
    assert guards[-1][0] == f"{symbol} > 2"
    origin = guards[-1][1]
    assert origin.endswith(f"test_compat.py:{_add_then_branch.__code__.co_firstlineno + 2} in _add_then_branch")


def test_shape_guard_origin_drops_torch_frame_only_where_there_is_one():
    user_line = "# model.py:7 in forward"
    assert compat_shapes._TORCH_FRAME.sub("", f"{user_line} (_dynamo/variables/tensor.py:2606 in evaluate_expr)") == \
        user_line
    assert compat_shapes._TORCH_FRAME.sub("", user_line) == user_line


def test_a_guard_names_the_users_file_in_full(tmp_path, monkeypatch, no_cache):
    """torch shortens the file of the line that made a guard relative to the directory it shares with torch; where
    that is only "/" it cut the first letter off the path ("/tmp/m.py" became "mp/m.py"). vgc's messages name the
    file as it is."""
    import importlib

    source = tmp_path / "branchy_model.py"
    source.write_text("import torch\n\n\ndef forward(x):\n    if x.shape[0] > 4:\n        return x * 2\n"
                      "    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    forward = importlib.import_module("branchy_model").forward
    compiled = vgc.compile(forward)
    compiled(torch.ones(8))
    with pytest.raises(vgc.InputMismatchError, match=f"# {re.escape(str(source))}:5 in forward"):
        compiled(torch.ones(2))
    # what torch wrote for it, repaired; a name no loaded file ends with is left as torch gave it
    cut = str(source)[2:] if str(source).startswith("/") else str(source)
    assert compat_shapes._user_line(f"if x:  # {cut}:5 in forward (_dynamo/x.py:1 in f)") == \
        f"if x:  # {source}:5 in forward"
    assert compat_shapes._user_line("# nowhere/model.py:3 in forward") == "# nowhere/model.py:3 in forward"


def test_without_a_fake_mode_there_are_no_symbols_or_guards():
    assert _compat.symbol_sources(None) == {} and _compat.shape_guards(None) == []


def test_source_name_is_read_as_a_method_or_a_property():
    seen = _trace(_add_then_branch, torch.ones(5), torch.ones(5))
    assert "L['x']" in seen["input_names"]   # the installed torch's form

    class PropertyNamed:   # the other torch versions' form
        name = "L['x']"
    assert _compat.source_name(PropertyNamed()) == "L['x']"


def test_traced_value_round_trip():
    seen = _trace(_add_then_branch, torch.ones(5), torch.ones(5))
    node = next(n for n in seen["gm"].graph.nodes if n.op == "call_function")
    assert isinstance(_compat.traced_value(node), torch.Tensor)
    _compat.set_traced_value(node, 3)
    assert _compat.traced_value(node) == 3
    assert _compat.traced_value(next(iter(fx.symbolic_trace(lambda x: x + 1).graph.nodes))) is None


def test_device_from_inputs():
    assert _compat.device_from_inputs([]) == torch.device("cpu")
    assert _compat.device_from_inputs([2, 0.5]) == torch.device("cpu")   # only Python numbers: CPU
    assert _compat.device_from_inputs([2, torch.empty(1, device="meta"), torch.empty(1)]) == torch.device("meta")


# ---- Inductor ----------------------------------------------------------------------------------------------------

def test_inductor_option_names():
    import torch._inductor.config as inductor_config

    names = _compat.inductor_option_names()
    assert names == set(inductor_config.get_config_copy())
    assert {"max_autotune", "coordinate_descent_tuning"} <= names and "no_such_option" not in names
    assert _compat.inductor_option_names() is names   # read once


# ---- the view-op table -------------------------------------------------------------------------------------------

# One call per certain view in the table, as models write it; each must really share its argument's storage. The
# argument is a real [3, 4] tensor, except for the complex views below.
_CERTAIN_VIEWS = {
    "__getitem__": lambda x: x[0], "adjoint": lambda x: x.adjoint(), "as_strided": lambda x: x.as_strided((2,), (1,)),
    "detach": lambda x: x.detach(), "diagonal": lambda x: x.diagonal(), "expand": lambda x: x[:1].expand(3, 4),
    "expand_as": lambda x: x[:1].expand_as(x), "movedim": lambda x: x.movedim(0, 1),
    "moveaxis": lambda x: x.moveaxis(0, 1), "narrow": lambda x: x.narrow(0, 1, 2), "permute": lambda x: x.permute(1, 0),
    "real": lambda x: x.real, "imag": lambda x: x.imag,
    "select": lambda x: x.select(0, 1), "squeeze": lambda x: x[:1].squeeze(0), "swapaxes": lambda x: x.swapaxes(0, 1),
    "swapdims": lambda x: x.swapdims(0, 1), "t": lambda x: x.t(), "transpose": lambda x: x.transpose(0, 1),
    "unflatten": lambda x: x.unflatten(1, (2, 2)), "unfold": lambda x: x.unfold(1, 2, 1),
    "unsqueeze": lambda x: x.unsqueeze(0), "view": lambda x: x.view(12), "view_as": lambda x: x.view_as(x),
    "view_as_complex": lambda x: torch.view_as_complex(x), "view_as_real": lambda x: torch.view_as_real(x),
    "alias": lambda x: torch.ops.aten.alias(x), "slice": lambda x: torch.ops.aten.slice(x, 0, 1),
    "H": lambda x: x.H, "mH": lambda x: x.mH, "mT": lambda x: x.mT, "T": lambda x: x.T,
}


_COMPLEX_ARGUMENTS = {"imag": lambda: torch.randn(3, 4, dtype=torch.complex64),
                      "view_as_real": lambda: torch.randn(3, 4, dtype=torch.complex64),
                      "view_as_complex": lambda: torch.randn(3, 4, 2)}


def test_every_certain_view_in_the_table_is_a_view_in_torch():
    assert set(_CERTAIN_VIEWS) == {name for name, certain in aliasing.VIEW_OPS.items() if certain}
    for name, make in _CERTAIN_VIEWS.items():
        base = _COMPLEX_ARGUMENTS.get(name, lambda: torch.randn(3, 4))()
        assert make(base).untyped_storage().data_ptr() == base.untyped_storage().data_ptr(), name


def test_reshape_is_only_a_possible_view():
    x = torch.randn(3, 4)
    assert x.reshape(12).untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert x.t().reshape(12).untyped_storage().data_ptr() != x.untyped_storage().data_ptr()   # a copy
    assert aliasing.VIEW_OPS["reshape"] is False and aliasing.VIEW_OPS["contiguous"] is False


def _nodes(fn):
    return [n for n in fx.symbolic_trace(fn).graph.nodes if n.op in ("call_function", "call_method")]


def test_views_are_recognised_by_identity_as_a_function_method_or_operator():
    certain = [lambda x: x.transpose(0, 1), lambda x: torch.transpose(x, 0, 1), lambda x: x[0],
               lambda x: torch.ops.aten.transpose.int(x, 0, 1), lambda x: torch.ops.aten.transpose(x, 0, 1)]
    for fn in certain:
        (node,) = _nodes(fn)
        assert aliasing.is_view(node) and aliasing.may_be_view(node), node.target
    (reshape,) = _nodes(lambda x: x.reshape(-1))
    assert aliasing.may_be_view(reshape) and not aliasing.is_view(reshape)
    (add,) = _nodes(lambda x: x + 1)
    assert not aliasing.may_be_view(add)


def test_a_callable_merely_named_like_a_view_is_only_a_possible_view():
    def transpose(x):   # not torch's
        return x

    node = fx.Graph().create_node("call_function", transpose, (None,))
    assert aliasing.may_be_view(node) and not aliasing.is_view(node)


def test_mutated_inputs_through_views_setitem_and_possible_views():
    def f(cache, x, y, z, w):
        cache.unbind(0)[1].add_(x)      # through a tuple of views
        y.contiguous().mul_(2)          # contiguous returns y itself when it already is
        z[0] = x                        # Dynamo records this as operator.setitem
        w.reshape(-1).clone().add_(1)   # a copy of a possible view: not w
        return x * 2

    seen = _trace(f, torch.zeros(2, 3), torch.ones(3), torch.ones(3), torch.zeros(2, 3), torch.ones(3), dynamic=False)
    gm, names = seen["gm"], seen["input_names"]
    assert any(n.target is operator.setitem for n in gm.graph.nodes)
    assert {names[i] for i in mutated_inputs(gm)} == {"L['cache']", "L['y']", "L['z']"}


def test_split_moves_only_certain_views_of_inputs_into_the_eager_piece():
    def f(x, y):
        moved = y.transpose(0, 1)          # a view whatever y's strides
        kept = y.reshape(-1)               # a view only for some strides
        copied = y[torch.tensor([0, 1])]   # tensor indexing copies
        z = x * 2
        return torch.relu(moved), torch.relu(kept), torch.relu(copied), z + 1

    split_gm, pieces = split_graph(fx.symbolic_trace(f), ["aten::relu"])
    eager = [p for p in pieces if p.is_splitting]
    assert len(eager) == 1
    assert [n.target for n in eager[0].module.graph.nodes if n.op == "call_method"] == ["transpose"]
    x, y = torch.randn(3), torch.randn(2, 3)
    for got, want in zip(split_gm(x, y), f(x, y)):
        torch.testing.assert_close(got, want)


def test_in_place_operators_write_and_a_conversion_copy_does_not():
    def f(x, y, w, v):
        x += 1                          # operator.iadd
        y *= 2                          # operator.imul
        a = w.float()                   # bf16 -> fp32: a copy, writing it leaves w alone
        a.mul_(2)
        b = v.float()                   # already fp32: returns v itself
        b.mul_(2)
        return x + y + a + b

    args = (torch.ones(3), torch.ones(3), torch.ones(3, dtype=torch.bfloat16), torch.ones(3))
    seen = _trace(f, *args, dynamic=False)
    names = seen["input_names"]
    assert {names[i] for i in mutated_inputs(seen["gm"])} == {"L['x']", "L['y']", "L['v']"}


_PRIVATE_TORCH = re.compile(r"\btorch(?:\.\w+)*\.(_(?!_)\w*)|from torch[\w.]* import _(?!_)")


def test_private_torch_apis_are_used_only_in_compat():
    """The rule of vgc/_compat/: every private torch API vgc uses lives there (strings and comments aside)."""
    offenders = []
    for path in sorted(Path(vgc.__file__).parent.rglob("*.py")):
        if path.parent.name == "_compat":
            continue
        with open(path, "rb") as f:
            code = [tok for tok in tokenize.tokenize(f.readline)
                    if tok.type not in (tokenize.STRING, tokenize.COMMENT, tokenize.ENCODING)]
        text = tokenize.untokenize(code)
        offenders += [f"{path.name}: {m.group(0)}" for m in _PRIVATE_TORCH.finditer(text)]
    assert offenders == []


def test_forget_size_history_keeps_compiled_code_and_forgets_dims_seen_varying(fresh_counters):
    from torch._dynamo import pgo

    def scale(x):
        return x * 2

    compiled = torch.compile(scale, backend="eager")
    for n in (2, 3):   # the second size makes Dynamo mark dim 0 dynamic in its code state
        compiled(torch.ones(n))
    assert any("scale" in str(key) for key in pgo.get_code_state())
    _compat.forget_size_history()
    assert not any("scale" in str(key) for key in pgo.get_code_state())
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch.testing.assert_close(compiled(torch.ones(5)), torch.full((5,), 2.0))   # still compiled: no new graph
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames


def test_saved_traces_keep_model_state_guards_and_drop_function_defaults():
    """What a saved trace re-checks in the next process: the model's attribute values and globals; not functions'
    default values (code, pinned by the source hash, and not always built yet in a fresh process: transformers
    5.25's per-module kernel wrappers) nor tensors (vgc checks weights itself)."""
    from types import SimpleNamespace

    def entry(name, is_global=False, guard_type="EQUALS_MATCH"):
        return SimpleNamespace(name=name, guard_type=guard_type, derived_guard_types=(), is_global=is_global,
                               orig_guard=SimpleNamespace())

    keep = _compat.model_state_guard_filter({"input_ids"})
    entries = [entry("L['self'].scale"), entry("G['EPS']", is_global=True),
               entry("L['self'].forward.__defaults__[0]"),
               entry("L['self'].fn.__closure__[0].cell_contents.__kwdefaults__['x']"),
               entry("L['self'].weight", guard_type="TENSOR_MATCH")]
    assert keep(entries) == [True, True, False, False, False]


def test_the_cpu_isa_check_runs_in_a_private_directory_when_the_cache_cannot_be_written(monkeypatch, caplog):
    """Inductor's check builds and locks test libraries in its cache directory: a read-only or full root fails it
    (EROFS, ENOSPC). It then runs once more in a temporary directory, and the setting is given back."""
    import errno
    import os

    import torch._inductor.cpu_vec_isa as cpu_vec_isa

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/the/root/inductor_cache")
    seen = []

    def pick():
        seen.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        if len(seen) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        assert os.path.isdir(seen[-1])
        return "avx2"

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", pick)
    with caplog.at_level("WARNING", logger="vgc"):
        assert _compat.cpu_vec_isa() == "avx2"
    assert seen[0] == "/the/root/inductor_cache" and seen[1] != seen[0] and not os.path.exists(seen[1])
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/the/root/inductor_cache"
    assert [r.getMessage() for r in caplog.records] == [
        "Inductor's CPU check cannot write under /the/root/inductor_cache (No space left on device); it runs in a "
        "temporary directory instead"]


def test_inductor_names_a_generated_module_by_its_stripped_source(tmp_path, monkeypatch):
    """The name the kernel-hash check holds a generated `.py` to is the one `PyCodeCache.write` gives it; where a
    torch lacks `code_hash`, there is no name to check (None), never a false alarm."""
    from torch._inductor import codecache

    source = "\n\ndef call(args):\n    return args\n"
    _, path = codecache.PyCodeCache.write(source)
    assert _compat.inductor_code_name(source) == Path(path).stem
    assert _compat.inductor_code_name(source + "# other\n") != Path(path).stem
    monkeypatch.delattr(codecache, "code_hash")
    assert _compat.inductor_code_name(source) is None


def test_reduced_fp32_matmuls_is_read_per_device_and_false_where_torch_has_no_setting():
    """The default (ieee) is exact everywhere; a device without a matmul precision setting (no such backend in
    this torch) counts as exact; TF32 set through the legacy API is seen through the new getter."""
    assert not _compat.reduced_fp32_matmuls("cuda") and not _compat.reduced_fp32_matmuls("cpu")
    assert not _compat.reduced_fp32_matmuls("xpu")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        assert _compat.reduced_fp32_matmuls("cuda") and _compat.reduced_fp32_matmuls("cpu")
        assert not _compat.reduced_fp32_matmuls("meta")
    finally:
        torch.set_float32_matmul_precision(before)


def test_copy_many_copies_mixed_dtypes_in_one_multi_tensor_copy_per_dtype(monkeypatch):
    """A decode step's inputs (int64 ids, int32 lengths and tables, fp32 values): every pair copied, one
    `torch._foreach_copy_` per dtype (torch copies a mixed list tensor by tensor), one call for a single dtype."""
    calls = []
    real = torch._foreach_copy_

    def counted(targets, sources):
        calls.append({t.dtype for t in targets})
        return real(targets, sources)

    monkeypatch.setattr(torch, "_foreach_copy_", counted)
    sources = [torch.arange(5), torch.arange(3, dtype=torch.int32), torch.randn(2, 3), torch.arange(7) * 3,
               torch.ones(4, 2, dtype=torch.int32)]
    targets = [torch.empty_like(s) for s in sources]
    _compat.copy_many(targets, tuple(sources))   # a tuple, as a captured graph hands its sources
    assert all(torch.equal(t, s) for t, s in zip(targets, sources))
    assert sorted(map(sorted, calls), key=str) == sorted([[torch.int64], [torch.int32], [torch.float32]], key=str)
    calls.clear()
    _compat.copy_many(targets[:1] + targets[3:4], [sources[0] + 1, sources[3] + 1])
    assert calls == [{torch.int64}] and torch.equal(targets[3], sources[3] + 1)
    _compat.copy_many([], [])   # nothing to copy: no call
    assert len(calls) == 1
