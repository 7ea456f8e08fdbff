"""The model's plain values a saved trace baked in are recorded at capture and checked by vgc at a load, in place of
Dynamo's value guards: real guard entries from Dynamo, real saved traces, the refusals named."""

import logging

import pytest
import torch

import vgc
from vgc import _compat
from vgc.capture.state_values import StateValue, StateValueRecorder, values_mismatch
from vgc.models import llama
from conftest import FP32_TOL


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.scale = 0.5
        self.shift = 3
        self.parts = (2, 6)
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Identity(), "b": torch.nn.Identity()})

    def forward(self, x):
        first, second = self.lin(x).split(self.parts, dim=-1)
        for head in self.heads.values():
            first = head(first)
        return torch.cat([first * self.scale, second + self.shift], dim=-1)


def dynamo_guard_entries(model, x) -> list:
    """The guard entries Dynamo hands a `guard_filter_fn` for `model(x)`, as torch.compile makes them."""
    seen = []

    def record(entries):
        seen.extend(entries)
        return [True] * len(entries)
    torch._dynamo.reset()
    torch.compile(model, backend="eager", options={"guard_filter_fn": record})(x)
    torch._dynamo.reset()
    return seen


def test_value_guards_on_the_model_are_taken_over_and_the_rest_stay_dynamos():
    model = Scaled()
    entries = dynamo_guard_entries(model, torch.randn(2, 8))
    recorder = StateValueRecorder(model)
    keep = _compat.model_state_guard_filter({"x"}, recorder.take_over)(entries)
    taken = {(v.source, v.kind, repr(v.expected)) for v in recorder.values}
    assert ("L['self'].scale", "equals", "0.5") in taken
    assert ("L['self'].shift", "equals", "3") in taken
    assert any(v.kind == "empty" for v in recorder.values)   # the submodules' hooks
    kept = [e for e, k in zip(entries, keep) if k]
    # no value guard on the model is left to Dynamo; the key order of the ModuleDict and global torch state are
    assert not [e.name for e in kept if e.name.startswith("self") and e.guard_type != "DICT_KEYS_MATCH"]
    assert {e.guard_type for e in kept} >= {"DICT_KEYS_MATCH", "GLOBAL_STATE"}
    assert values_mismatch(recorder.values, {"self": model}) is None


@pytest.mark.parametrize("change, named", [
    (lambda m: setattr(m, "scale", 0.25), "L['self'].scale is 0.25; the trace had 0.5"),
    (lambda m: setattr(m, "shift", 3.0), "L['self'].shift is 3.0; the trace had 3"),      # another type
    (lambda m: setattr(m, "parts", (4, 4)), "L['self'].parts"),
    (lambda m: m.heads["a"].register_forward_hook(lambda *a: None), "entries; the trace had none"),
    (lambda m: delattr(m, "shift"), "the model has no value at"),
])
def test_each_recorded_value_catches_its_change(change, named):
    model = Scaled()
    recorder = StateValueRecorder(model)
    entries = dynamo_guard_entries(model, torch.randn(2, 8))
    _compat.model_state_guard_filter({"x"}, recorder.take_over)(entries)
    change(model)
    problem = values_mismatch(recorder.values, {"self": model})
    assert problem is not None and named in problem, problem


def test_a_value_vgc_cannot_read_back_stays_dynamos_guard():
    """Only values vgc reads as Dynamo recorded them are taken over: a path it cannot follow, another root, a
    NaN, an unplain value are left to Dynamo."""
    class Entry:
        def __init__(self, name, value, guard_type="CONSTANT_MATCH", is_global=False):
            self.name, self.value, self.guard_type, self.is_global, self.has_value = \
                name, value, guard_type, is_global, True
    model = Scaled()
    model.nan = float("nan")
    recorder = StateValueRecorder(model)
    assert recorder.take_over(Entry("self.scale", 0.5))
    assert not recorder.take_over(Entry("self.scale", 0.75))            # not what vgc reads: Dynamo's
    assert not recorder.take_over(Entry("___odict_getitem(self.heads, 'a')", 1))
    assert not recorder.take_over(Entry("x.shape[0]", 2))
    assert not recorder.take_over(Entry("self.nan", float("nan")))
    assert not recorder.take_over(Entry("self.lin", model.lin, "EQUALS_MATCH"))
    assert not recorder.take_over(Entry("G['SCALE']", 2.0, is_global=True))
    assert [v.source for v in recorder.values] == ["L['self'].scale"]


def test_types_count_in_equality():
    holder = torch.nn.Module()
    holder.flag, holder.pair = 1, [1, 2]
    roots = {"self": holder}
    assert StateValue("L['self'].flag", "equals", True).mismatch(roots) is not None
    assert StateValue("L['self'].flag", "equals", 1.0).mismatch(roots) is not None
    assert StateValue("L['self'].flag", "equals", 1).mismatch(roots) is None
    assert StateValue("L['self'].pair", "equals", (1, 2)).mismatch(roots) is not None
    assert StateValue("L['self'].pair", "equals", [1, 2]).mismatch(roots) is None


def test_a_saved_trace_refuses_a_changed_value_by_name_and_loads_the_same_one(tmp_path, monkeypatch, caplog):
    """Through `vgc.compile`: the saved trace records the values; a model with one layer's scale changed is
    refused (the reason names it) and traced (its trace saved in the first one's place), and one with the same
    values as that loads it; both equal eager."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    config = vgc.CompilationConfig(piece_backend="eager")
    first = vgc.compile(llama.Llama(cfg), config=config)
    first.warmup(lambda n: llama.make_batch(cfg, n))
    assert first.trace_source == "traced"
    changed = llama.Llama(cfg)
    changed.layers[1].scale = changed.layers[1].scale * 2
    with caplog.at_level(logging.INFO, logger="vgc"), vgc.counters.expect(dynamo_traces=1, traces_loaded=0):
        other = vgc.compile(changed, config=config)
        other.warmup(lambda n: llama.make_batch(cfg, n))
    assert "_modules['layers']._modules['1'].scale is" in caplog.text
    alike = llama.Llama(cfg)
    alike.layers[1].scale = changed.layers[1].scale
    with vgc.counters.expect(dynamo_traces=0, traces_loaded=1):
        same = vgc.compile(alike, config=config)
        same.warmup(lambda n: llama.make_batch(cfg, n))
    with torch.no_grad():
        for model, compiled in ((changed, other), (alike, same)):
            torch.testing.assert_close(compiled(**llama.make_batch(cfg, 5)), model(**llama.make_batch(cfg, 5)),
                                       **FP32_TOL)
