"""Per-model records: each compiled model reports its own work; `vgc.counters` is the process total."""

import pytest
import torch

import vgc
from vgc.models import llama
from conftest import FP32_TOL, MLP


def test_two_models_in_one_process_report_their_own_work(tiny, fresh_counters, tmp_path, monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path))
    cfg, decoder = tiny
    mlp = MLP()

    with vgc.counters.delta() as total:
        first = vgc.compile(decoder)
        first.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
        after_first = first.stats()["model_counters"]
        second = vgc.compile(mlp)
        second.warmup(lambda n: (torch.randn(n, 32),))
        # the same decoder again, in the same process: every artifact comes from the cache
        third = vgc.compile(decoder)
        third.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))

    a, b, c = (m.stats()["model_counters"] for m in (first, second, third))
    assert a == after_first, "compiling other models must not change the first model's record"
    assert (a["dynamo_traces"], a["pieces"], a["splitting_pieces"], a["unique_pieces"]) == (1, 5, 2, 3)
    assert a["inductor_compiles"] == 3 and a["artifacts_loaded"] == 0 and a["cache_misses"] == 3
    assert (b["dynamo_traces"], b["pieces"], b["splitting_pieces"], b["inductor_compiles"]) == (1, 1, 0, 1)
    assert c["inductor_compiles"] == 0 and c["artifacts_loaded"] == 3 and c["cache_hits"] == 3
    assert first.stats()["artifacts_compiled"] == 3 and third.stats()["artifacts_loaded"] == 3
    for name in a:   # the process total is the sum of the models' records
        assert total[name] == a[name] + b[name] + c[name], name
    x = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(second(x), mlp(x), **FP32_TOL)


class Doubled:
    def __call__(self, x):
        return torch.relu(x) * 2


def test_a_second_trace_of_a_trace_once_model_is_refused(no_cache):
    compiled = vgc.compile(Doubled())   # a callable object: Dynamo's own entry runs it, not a saved program
    compiled(torch.randn(4, 32))
    torch._dynamo.reset()   # Dynamo forgets the code: the next call would trace again, before any warm-up
    with pytest.raises(vgc.CompileAfterWarmupError, match="traces once"):
        compiled(torch.randn(4, 32))


def test_expect_names_each_counter_that_changed_otherwise():
    process = vgc.counters.__class__()
    model = process.child_of(process)
    with process.expect(pieces=2, inductor_compiles=0) as changes:
        model.add(pieces=2)
    assert changes["pieces"] == 2 and (model.pieces, process.pieces) == (2, 2)
    with pytest.raises(AssertionError, match="inductor_compiles changed by 1, expected 0"):
        with process.expect(inductor_compiles=0):
            model.add(inductor_compiles=1)
    with pytest.raises(ValueError, match="unknown counter"):
        with process.expect(compiles=0):
            pass
    assert "cudagraph_replays" not in model.as_dict(per_call=False) and "cudagraph_replays" in model.as_dict()
