"""CUDA-graph logic that runs without a GPU: padding, size dispatch, and the no-CUDA behaviour."""

import logging

import pytest
import torch

import vgc
from vgc.cudagraph.padding import batch_dims, StaticInputs, pad_into, padded_size, slice_outputs
from vgc.models import llama
from conftest import FP32_TOL


def test_default_capture_sizes():
    sizes = vgc.CompilationConfig().resolved_capture_sizes()
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 512
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:]))
    assert vgc.CompilationConfig(max_cudagraph_capture_size=20).resolved_capture_sizes() == [1, 2, 4, 8, 16]
    assert vgc.CompilationConfig(cudagraph_capture_sizes=[64, 3, 3, 900], max_cudagraph_capture_size=512
                                 ).resolved_capture_sizes() == [3, 64]


def test_padded_size_is_the_next_capture_size():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16, 17)] == [1, 2, 4, 8, 8, 16, 16, None]


def test_pad_values_numbers_and_edge():
    buffer = torch.full((8,), 99)
    view = pad_into(buffer, torch.tensor([3, 4, 5]), 0, 2, -1)
    assert view.tolist() == [3, 4, 5, -1, -1] and view.data_ptr() == buffer.data_ptr()
    offsets = pad_into(torch.zeros(8, dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32), 0, 3, "edge")
    assert offsets.tolist() == [0, 1, 2, 2, 2, 2]
    table = pad_into(torch.ones(6, 2), torch.full((2, 2), 7.0), 0, 2, 0)
    assert table.tolist() == [[7, 7], [7, 7], [0, 0], [0, 0]]


def test_a_padded_call_copies_values_and_pad_entries_in_one_multi_tensor_copy_per_dtype(monkeypatch):
    """A decode call padded to a capture size: its values and its number-padded tails in one
    `torch._foreach_copy_` per dtype (no launch per input for the pads; "edge" pads repeat the last entry after
    it); the same values while a graph is captured, where no pad tensor is made (its fill would be a step of the
    graph) and the tails are filled in place."""
    from vgc import cuda_runtime
    from vgc.cudagraph import padding

    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda t, s: (calls.append(len(t)), real(t, s)))
    batch = {"ids": torch.tensor([5, 6, 7]), "slots": torch.tensor([9, 10, 11]),
             "lens": torch.tensor([3, 4, 1], dtype=torch.int32), "qsl": torch.tensor([0, 1, 2, 3], dtype=torch.int32)}
    pad_values = {"ids": 0, "slots": -1, "lens": 0, "qsl": "edge"}
    want = {"ids": [5, 6, 7, 0, 0], "slots": [9, 10, 11, -1, -1], "lens": [3, 4, 1, 0, 0], "qsl": [0, 1, 2, 3, 3, 3]}
    for capturing in (False, True, False):
        monkeypatch.setattr(cuda_runtime, "stream_capturing", lambda: capturing)
        padding._FILLED.clear()
        calls.clear()
        static = StaticInputs(max_size=8, pad_values=pad_values)
        for name, value in batch.items():
            static.reserve(name, value, 0, 3)
        views = static.pad_all(batch, dict.fromkeys(batch, 0), 2)
        assert {name: view.tolist() for name, view in views.items()} == want
        # values and number pads: int64 ids and slots with their tails, int32 lens and qsl with lens' tail
        assert sorted(calls) == ([2, 2] if capturing else [3, 4])
        assert len(padding._FILLED) == (0 if capturing else 3)


def test_slice_outputs_cuts_the_learned_dims():
    out = (torch.zeros(8, 3), torch.zeros(3, 8), [torch.zeros(8)], 5)
    sliced = slice_outputs(out, 5)   # before the dims are learned: dim 0 when it is longer
    assert sliced[0].shape == (5, 3) and sliced[1].shape == (3, 8) and sliced[2][0].shape == (5,) and sliced[3] == 5
    batch_first = (torch.zeros(1, 8, 16), torch.zeros(8, 4))   # seq dim padded; a static [8, 4] output
    sliced = slice_outputs(batch_first, 5, iter([(1,), ()]))
    assert sliced[0].shape == (1, 5, 16) and sliced[1].shape == (8, 4)


def test_static_inputs_reserve_room_for_offsets():
    static = StaticInputs(max_size=16, pad_values={"qsl": "edge"})
    static.reserve("qsl", torch.zeros(17, dtype=torch.int32), 0, 16)   # one more entry than the batch size
    assert static.buffers["qsl"].shape == (17,)
    assert static.all_fit({"qsl": torch.zeros(4)}, {"qsl": 0}, padded=8, batch_size=3)
    assert not static.all_fit({"qsl": torch.zeros(30)}, {"qsl": 0}, padded=16, batch_size=3)
    assert not static.all_fit({"qsl": torch.zeros(4), "ids": torch.zeros(3)}, {"qsl": 0, "ids": 0}, 8, 3)   # no room
    static.reserve("ids", torch.zeros(16, dtype=torch.int64), 0, 16)
    assert static.all_fit({"qsl": torch.zeros(4), "ids": torch.zeros(3)}, {"qsl": 0, "ids": 0}, 8, 3)
    assert not static.all_fit({"qsl": torch.zeros(4), "ids": torch.zeros(14)}, {"qsl": 0, "ids": 0}, 8, 3)
    views = static.pad_all({"qsl": torch.tensor([0, 2, 3], dtype=torch.int32), "ids": torch.tensor([7, 8])},
                           {"qsl": 0, "ids": 0}, 5)
    assert views["qsl"].tolist() == [0, 2, 3, 3, 3, 3, 3, 3] and views["ids"].tolist() == [7, 8, 0, 0, 0, 0, 0]
    assert views["ids"].data_ptr() == static.buffers["ids"].data_ptr()


def test_an_input_already_in_its_buffer_is_not_copied_onto_itself():
    """An engine may write its inputs into vgc's buffers and pass views of them: that costs no copy."""
    static = StaticInputs(max_size=8, pad_values={})
    static.reserve("ids", torch.zeros(8, dtype=torch.int64), 0, 8)
    static.buffers["ids"][:3] = torch.tensor([4, 5, 6])
    in_place = static.buffers["ids"][:3]
    copies = []
    with _CountCopies(copies):
        views = static.pad_all({"ids": in_place}, {"ids": 0}, 0)
    assert views["ids"].tolist() == [4, 5, 6] and copies == []
    with _CountCopies(copies):   # padded: only the pad entry is written
        views = static.pad_all({"ids": in_place}, {"ids": 0}, 1)
    assert views["ids"].tolist() == [4, 5, 6, 0]
    assert copies == [("_foreach_copy_", [in_place.data_ptr() + 3 * 8])]


class _CountCopies(torch.overrides.TorchFunctionMode):
    """Records each copy op's name and the addresses it writes."""

    def __init__(self, copies):
        super().__init__()
        self.copies = copies

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if "copy" in getattr(func, "__name__", ""):
            targets = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            self.copies.append((func.__name__, [t.data_ptr() for t in targets]))
        return func(*args, **(kwargs or {}))


def test_llama_pad_values_make_padding_inert(tiny):
    """Padded tokens write no KV and padded sequences are empty: the real tokens' outputs do not change."""
    cfg, model = tiny
    batch = llama.make_batch(cfg, 5, "decode")
    padded = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            pad = 3
            buffer = torch.zeros((value.shape[0] + pad, *value.shape[1:]), dtype=value.dtype)
            padded[name] = pad_into(buffer, value, 0, pad, llama.PAD_VALUES.get(name, 0))
        else:
            padded[name] = [c.clone() for c in value]
    with torch.no_grad():
        reference = model(**batch)
        out = model(**padded)
    torch.testing.assert_close(out[:5], reference, **FP32_TOL)
    for ref_cache, cache in zip(batch["kv_caches"], padded["kv_caches"]):
        torch.testing.assert_close(cache, ref_cache, **FP32_TOL)
    assert llama.is_uniform_decode(batch) and not llama.is_uniform_decode(llama.make_batch(cfg, 5, "prefill"))


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_graph_mode_without_cuda_warns_and_runs_without_graphs(mode, tiny, caplog, fresh_counters, no_cache):
    cfg, model = tiny
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode=mode), pad_values=llama.PAD_VALUES)
    with caplog.at_level(logging.WARNING, logger="vgc"):
        report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode"))
    assert any("needs a CUDA device" in r.getMessage() for r in caplog.records)
    assert report["cudagraphs"] is None
    with torch.no_grad():
        out = compiled(**llama.make_batch(cfg, 6, "decode"))
    torch.testing.assert_close(out, model(**llama.make_batch(cfg, 6, "decode")), **FP32_TOL)
    assert fresh_counters.cudagraph_captures == 0 and fresh_counters.cudagraph_replays == 0


def test_full_and_piecewise_needs_a_uniform_decode_predicate(tiny):
    _, model = tiny
    with pytest.raises(ValueError, match="uniform_decode"):
        vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full_and_piecewise"))


def test_cudagraph_settings_share_one_cache_entry():
    base = vgc.CompilationConfig().compute_hash()
    assert vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[1, 2]).compute_hash() == base


def test_mutated_inputs_are_found_through_views():
    from vgc.aliasing import mutated_inputs

    def f(cache, x, y):
        cache[0].add_(x)              # through a view
        torch.ops.aten.index_copy_(y, 0, torch.tensor([0]), x[:1])   # through the op's schema
        return (x * 2).relu_()        # a temporary: not an input

    gm = torch.fx.symbolic_trace(f)
    assert mutated_inputs(gm) == {0, 2}


def _dispatcher(pad_values, calls):
    from vgc.cudagraph.dispatch import GraphDispatcher
    from vgc.cudagraph.runtime import GraphRuntime

    def call(arguments):
        calls.append({k: v.clone() for k, v in arguments.items()})
        return arguments["x"][:, None] * 2

    runtime = GraphRuntime([4, 8], capture_on_demand=False, counters=vgc.counters)
    traced = {"x": torch.zeros(16), "offsets": torch.zeros(17, dtype=torch.long)}
    dispatcher = GraphDispatcher(call, vgc.CUDAGraphMode.PIECEWISE, [4, 8], {"x": 0, "offsets": 0}, pad_values,
                                 None, runtime, traced_arguments=traced, traced_output=torch.zeros(16, 1))
    dispatcher.static.reserve("x", torch.zeros(8), 0, 8)
    dispatcher.static.reserve("offsets", torch.zeros(9, dtype=torch.long), 0, 8)
    dispatcher.learn_output_dims(torch.zeros(8, 1), 8)
    return dispatcher


def test_dispatcher_pads_to_the_next_capture_size_and_slices_back(fresh_counters):
    calls = []
    dispatcher = _dispatcher({"offsets": "edge"}, calls)
    assert dispatcher.output_dims == [(0,)]
    out = dispatcher.run({"x": torch.arange(5.0), "offsets": torch.arange(6)})
    assert out.shape == (5, 1) and out[:, 0].tolist() == [0, 2, 4, 6, 8]
    assert calls[-1]["x"].tolist() == [0, 1, 2, 3, 4, 0, 0, 0]              # padded with 0
    assert calls[-1]["offsets"].tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5]     # padded by repeating the last entry
    out = dispatcher.run({"x": torch.arange(9.0), "offsets": torch.arange(10)})   # above every capture size
    assert out.shape == (9, 1) and calls[-1]["x"].shape == (9,) and fresh_counters.eager_runs == 1


def test_dispatcher_without_pad_values_only_serves_exact_sizes(fresh_counters):
    calls = []
    dispatcher = _dispatcher(None, calls)
    dispatcher.run({"x": torch.arange(5.0), "offsets": torch.arange(6)})
    assert calls[-1]["x"].shape == (5,) and fresh_counters.eager_runs == 1   # not padded: un-graphed
    out = dispatcher.run({"x": torch.arange(8.0), "offsets": torch.arange(9)})
    assert out.shape == (8, 1) and fresh_counters.eager_runs == 1            # exact capture size: graphed path


def test_one_rule_says_which_output_dims_follow_the_call_size():
    assert batch_dims([(8, 16), (8,)], 8, [(4, 16), (4,)], 4) == [(0,), (0,)]
    assert batch_dims([(8, 8)], 8, [(4, 8)], 4) == [(0,)]         # 8 at both sizes is not the batch
    assert batch_dims([(9, 2)], 8, [(5, 2)], 4) == [()]          # size + 1: never cut to the size
    assert batch_dims([(8, 3)], 8, [(8, 3)], 8) == [(0,)]         # one size seen twice (the trace's own)
    assert batch_dims([(8,)], 8, [(4,), (4,)], 4) is None        # the calls disagree on their outputs
