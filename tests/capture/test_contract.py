"""`vgc.compile`'s input contract: tensors inside containers and dataclasses, dims addressed by path, objects it
cannot check refused, messages that show shapes and dtypes, never tensor contents."""

from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

import vgc
from vgc.capture.contract import dynamic_dims
from conftest import FP32_TOL


class AttendToPast(nn.Module):
    """Attention of new queries over a per-layer list of past keys, concatenated along the sequence dim (2)."""

    def forward(self, q, past_kv: list):
        out = q
        for past in past_kv:
            keys = torch.cat([past, q], dim=2)
            out = out + torch.softmax(out @ keys.transpose(-1, -2), dim=-1) @ keys
        return out


def _inputs(new: int, past: int, layers: int = 2):
    torch.manual_seed(new * 100 + past)
    return torch.randn(1, 2, new, 8), [torch.randn(1, 2, past, 8) for _ in range(layers)]


def test_dims_of_tensors_in_a_list_are_dynamic_by_path(no_cache):
    model = AttendToPast()
    compiled = vgc.compile(model, dynamic_arg_dims={"q": 2, "past_kv": {"*": 2}})
    with vgc.counters.delta() as d:
        for new, past in ((3, 7), (1, 8), (4, 20), (2, 2)):
            q, past_kv = _inputs(new, past)
            with torch.no_grad():
                torch.testing.assert_close(compiled(q, past_kv), model(q, past_kv), **FP32_TOL)
    assert d["dynamo_traces"] == 1 and compiled.stats()["dynamic_dims"] == {
        "q": [2], "past_kv[0]": [2], "past_kv[1]": [2]}
    with pytest.raises(vgc.InputMismatchError, match=r"'past_kv': length 3 differs from the traced 2"):
        compiled(*_inputs(2, 5, layers=3))
    with pytest.raises(vgc.InputMismatchError, match=r"past_kv'\[0\]: dtype torch.float64"):
        q, past_kv = _inputs(2, 5)
        compiled(q, [past_kv[0].double(), past_kv[1]])


def test_dynamic_arg_dims_forms_for_containers():
    q, past_kv = _inputs(3, 7)
    arguments = {"q": q, "past_kv": past_kv}
    everywhere = {"q": {}, "past_kv[0]": {2: None}, "past_kv[1]": {2: None}}
    assert dynamic_dims(arguments, {"past_kv": 2}) == everywhere          # an int applies to every tensor inside
    assert dynamic_dims(arguments, {"past_kv": {"*": 2}}) == everywhere
    assert dynamic_dims(arguments, {"past_kv": {1: [2]}})["past_kv[0]"] == {}
    assert dynamic_dims(arguments, {"past_kv": {0: {2: "seq"}}})["past_kv[0]"] == {2: "seq"}
    with pytest.raises(ValueError, match=r"dynamic_arg_dims\['past_kv'\].*marks no dim.*a list"):
        dynamic_dims(arguments, {"past_kv": {"keys": 2}})
    with pytest.raises(ValueError, match=r"'past_kv\[0\]': dim 4 is out of range for a 4-d tensor"):
        dynamic_dims(arguments, {"past_kv": 4})


@dataclass
class Metadata:
    lens: torch.Tensor
    scale: float


class Scaled(nn.Module):
    def forward(self, x, meta: Metadata):
        return x * meta.scale + meta.lens.sum()


def test_dataclass_fields_are_checked_per_call(no_cache):
    model = Scaled()
    compiled = vgc.compile(model, dynamic_arg_dims={"x": 0, "meta": {"lens": 0}})
    for n in (5, 3, 9):
        x, meta = torch.randn(n, 4), Metadata(torch.arange(float(n)), 2.0)
        torch.testing.assert_close(compiled(x, meta), model(x, meta), **FP32_TOL)
    with pytest.raises(vgc.InputMismatchError, match=r"'meta'\.scale is 3.0 but was 2.0"):
        compiled(torch.randn(3, 4), Metadata(torch.arange(3.0), 3.0))
    # A tensor where the trace had a float: the message shows its shape and dtype, not hundreds of values.
    with pytest.raises(vgc.InputMismatchError, match=r"is a torch.float32 tensor of shape \(1000,\)") as error:
        compiled(torch.randn(3, 4), Metadata(torch.arange(3.0), torch.zeros(1000)))
    assert len(str(error.value)) < 400


def test_a_static_dim_inside_a_container_names_the_fix(no_cache):
    model = AttendToPast()
    compiled = vgc.compile(model, dynamic_arg_dims={"q": 2})
    compiled(*_inputs(3, 7))
    with pytest.raises(vgc.InputMismatchError, match=r"dynamic_arg_dims=\{'past_kv': \{0: 2\}\} \(or "
                                                     r"\{'past_kv': 2\} for dim 2 of every tensor in it\)"):
        compiled(*_inputs(3, 8))


class Opaque:
    def __init__(self, weight):
        self.weight = weight


class UsesOpaque(nn.Module):
    def forward(self, x, holder):
        return x * holder.weight


def test_an_object_vgc_cannot_check_is_refused_before_compiling(no_cache):
    compiled = vgc.compile(UsesOpaque())
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0):
        with pytest.raises(ValueError, match=r"argument 'holder' is a test_contract.Opaque, which vgc.compile "
                                             r"cannot check.*backend='vgc'"):
            compiled(torch.randn(4), Opaque(torch.ones(4)))


def test_size_assumptions_read_in_argument_terms_and_are_checked():
    import sympy
    from vgc.capture.size_guards import build_size_guards

    def resolve(location):   # the locations as given: these are the arguments' own names
        return location

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    sources = {s0: "L['x'].size()[0]", s1: "L['kv'][1].size()[2]"}
    by_dynamo = build_size_guards([(sympy.Eq(s0, s1), "model.py:3", sources)], resolve)
    by_inductor = build_size_guards([(64 * s0 <= 2147483647, "Inductor's generated code", sources),
                                     (s0 >= 2, "Inductor's generated code", sources)], resolve, by_inductor=True)
    assert [g.text for g in by_dynamo] == ["x.size(0) == kv[1].size(2)"]
    assert [g.text for g in by_inductor] == ["64*x.size(0) <= 2147483647"]   # sizes 0 and 1 stay allowed
    meta = torch.device("meta")   # sizes without memory
    kv = [torch.empty(1, device=meta), torch.empty(1, 2, 5, device=meta)]
    by_dynamo[0].check({"x": torch.empty(5, device=meta), "kv": kv})
    with pytest.raises(vgc.InputMismatchError, match=r"x.size\(0\) == kv\[1\].size\(2\) \(sizes x.size\(0\)=6, "
                                                     r"kv\[1\].size\(2\)=5\); it comes from: model.py:3"):
        by_dynamo[0].check({"x": torch.empty(6, device=meta), "kv": kv})
    by_inductor[0].check({"x": torch.empty(2 ** 25 - 1, device=meta), "kv": kv})
    with pytest.raises(vgc.InputMismatchError, match=r"64\*x.size\(0\) <= 2147483647"):
        by_inductor[0].check({"x": torch.empty(2 ** 25, device=meta), "kv": kv})


def test_a_wrapped_transformers_forward_gets_its_assumptions_checked_by_argument_name(no_cache):
    """transformers wraps forward in a `*args, **kwargs` decorator, so Dynamo names sizes `kwargs['input_ids']`;
    the contract still checks them against the bound arguments, in their names."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    compiled = vgc.compile(model, dynamic_arg_dims={"input_ids": 1, "attention_mask": 1})

    def run(fn, tokens, mask_tokens):
        ids = torch.randint(0, 100, (2, tokens), generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            return fn(input_ids=ids, attention_mask=torch.ones(2, mask_tokens, dtype=torch.long)).last_hidden_state

    for tokens in (9, 5, 17):
        torch.testing.assert_close(run(compiled, tokens, tokens), run(model, tokens, tokens), **FP32_TOL)
    either_order = r"(attention_mask.size\(1\) == input_ids.size\(1\)|input_ids.size\(1\) == attention_mask.size\(1\))"
    with pytest.raises(vgc.InputMismatchError, match=either_order):
        run(compiled, 5, 9)
    with pytest.raises(vgc.InputMismatchError, match=r"input_ids.size\(1\) <= 64 \(sizes input_ids.size\(1\)=70\)"):
        run(compiled, 70, 70)


def test_size_assumptions_read_as_python_in_the_calls_terms():
    """What a warning or an InputMismatchError shows a user: Python, not sympy's function names."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    from vgc.capture.size_guards import _render

    s0, s1 = sympy.symbols("s0 s1", integer=True)
    names = {s0: "input_values.size(1)", s1: "x.size(0)"}
    text = _render(sympy.Eq(PythonMod(FloorDiv(s0, 10) - 1, 16), 0), names)   # parentheses vary across torch
    assert "input_values.size(1) // 10" in text and "% 16" in text and text.endswith("== 0"), text
    assert "Mod" not in text and "FloorDiv" not in text
    assert _render(sympy.Le(-s0, -7), names) == "input_values.size(1) >= 7"
    assert _render(sympy.Ne(s1, 1), names) == "x.size(0) != 1"
    assert _render(sympy.Eq(s0, s1), names) == "input_values.size(1) == x.size(0)"


def test_a_saved_plans_shape_guards_come_back_as_saved_and_read_the_same(monkeypatch):
    """A warm start unpickles the trace's shape guards without simplifying them again (sympy's evaluation, and the
    tensor algebra it imports, cost a warm start 0.05-0.1 s): each equals the saved expression, checks the same
    calls and reads the same in messages."""
    import pickle

    import sympy
    import torch.fx as fx

    from vgc.capture.size_guards import build_size_guards
    from vgc.piecewise.plan import GraphPlan, SavedGraph
    from torch.utils._sympy.functions import FloorDiv

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    exprs = [sympy.Eq(s0, s1), sympy.Eq(sympy.Mod(s0, 8), 0), sympy.Le(7, s0), sympy.Ne(s0, 1),
             sympy.Eq(4 * s0, 4 * s1), sympy.Lt(FloorDiv(s0, 2) + 3, s1), sympy.Le(-s0, -5)]
    guards = [(e, "test", {s0: "L['x'].size()[0]", s1: "L['y'].size()[0]"}) for e in exprs]
    split = fx.symbolic_trace(torch.nn.Identity())
    plan = GraphPlan(split, [], [], "cpu", guards, compiler_guards=[], saved_split=pickle.dumps(split))
    data = SavedGraph.serialize_compile_artifacts(SavedGraph(plan))

    def built(snapshot):
        return build_size_guards(snapshot, lambda where: where, conditions_level=None)
    before = built(guards)
    from sympy.core import relational
    decided, is_eq = [], relational.is_eq   # sympy's evaluation of a relation: what a warm start skips
    monkeypatch.setattr(relational, "is_eq", lambda *a, **k: decided.append(a) or is_eq(*a, **k))
    loaded = SavedGraph.deserialize_compile_artifacts(data)
    after = built(loaded.plan.shape_guards)
    assert decided == []
    assert [e for e, _, _ in loaded.plan.shape_guards] == exprs
    assert [g.text for g in after] == [g.text for g in before] and len(after) == len(exprs)
    assert {"7 <= x.size(0)", "x.size(0) >= 5"} <= {g.text for g in after}   # the second turned to read plainly
    for sizes in ({"x": 16, "y": 16}, {"x": 16, "y": 24}, {"x": 3, "y": 3}, {"x": 8, "y": 9}):
        for a, b in zip(before, after):
            assert a.sizes == b.sizes
            values = [sizes[arg] for arg, _, _ in a.sizes]
            assert a.evaluate(*values) == b.evaluate(*values)


def _contract_of(arguments: dict, dynamic_arg_dims: dict):
    import inspect

    from vgc.capture.contract import argument_specs, InputContract

    dynamic = dynamic_dims(arguments, dynamic_arg_dims)
    signature = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for name in arguments])
    return InputContract(signature, arguments, argument_specs(arguments, dynamic), dynamic, [])


def _decode_call(n: int, **changes) -> dict:
    call = {"ids": torch.zeros(n, dtype=torch.long), "table": torch.zeros(n, 8),
            "kv": [torch.zeros(2, 16, 4) for _ in range(3)], "greedy": True,
            "meta": {"lens": torch.zeros(n, dtype=torch.int32)}}
    call.update(changes)
    return call


@pytest.mark.parametrize("with_torchs_check", [True, False])
def test_the_one_call_tensor_check_accepts_exactly_what_the_specs_accept(monkeypatch, with_torchs_check):
    """The tensors of a call (top level, and flat lists of them such as KV caches) are checked in one call of
    Dynamo's C++ tensor check; what it does not take goes to the specs' own checks. Every variant is answered as
    the specs alone answer it, and a serving loop's usual call takes the one check. Without torch's check (another
    torch), the specs answer alone."""
    from vgc import _compat

    if not with_torchs_check:
        monkeypatch.setattr(_compat, "tensor_checker", lambda *a: None)
    contract = _contract_of(_decode_call(4), {"ids": 0, "table": 0, "meta": {"lens": 0}})
    fast = contract._accepts_fast
    assert (fast is not None) == with_torchs_check
    variants = {
        "usual": _decode_call(6),
        "ids float": _decode_call(6, ids=torch.zeros(6)),
        "table wide": _decode_call(6, table=torch.zeros(6, 9)),
        "table transposed": _decode_call(6, table=torch.zeros(8, 6).t()),
        "table with grad": _decode_call(6, table=torch.zeros(6, 8, requires_grad=True)),
        "table of rank 3": _decode_call(6, table=torch.zeros(6, 8, 1)),
        "kv short": _decode_call(6, kv=[torch.zeros(2, 16, 4)] * 2),
        "kv a tuple": _decode_call(6, kv=tuple(torch.zeros(2, 16, 4) for _ in range(3))),
        "kv permuted": _decode_call(6, kv=[torch.zeros(4, 16, 2).permute(2, 1, 0)] * 3),
        "kv half": _decode_call(6, kv=[torch.zeros(2, 16, 4, dtype=torch.half)] * 3),
        "kv holds None": _decode_call(6, kv=[None] * 3),
        "greedy off": _decode_call(6, greedy=False),
        "lens float": _decode_call(6, meta={"lens": torch.zeros(6)}),
    }
    spec_answers = {}
    for name, call in variants.items():
        monkeypatch.setattr(contract, "_accepts_fast", None)
        spec_answers[name] = contract.accepts(call)
        monkeypatch.setattr(contract, "_accepts_fast", fast)
        assert contract.accepts(call) == spec_answers[name], name
        if fast is not None and fast(call):
            assert spec_answers[name], name
    assert [name for name, ok in spec_answers.items() if ok] == ["usual", "table with grad"]
    if fast is not None:
        assert fast(variants["usual"]) and not fast(variants["table with grad"])


def test_a_reader_of_many_places_reads_what_follow_reads():
    """A FULL graph reads its KV caches' places on every call: a run of a list's items is read as the list whole,
    any other place (or a call laid out otherwise) by following its path."""
    from vgc.capture.paths import argument_tensors, follow, reader

    call = {"ids": torch.zeros(2), "kv": [torch.zeros(1) for _ in range(4)], "meta": {"cache": (torch.zeros(3),)},
            "pair": (torch.zeros(1), torch.zeros(1))}
    places = [(name, steps) for name, value in call.items() if name != "ids" for steps, _ in argument_tensors(value)]
    read = reader(places)
    for given in (call, {**call, "kv": {i: torch.ones(1) for i in range(4)}}, {**call, "kv": tuple(call["kv"])}):
        assert all(a is b for a, b in zip(read(given), [follow(given[n], s) for n, s in places], strict=True))
