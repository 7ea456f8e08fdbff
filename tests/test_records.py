"""Per-model records: each compiled model reports its own work; `vgc.counters` is the process total."""

import pytest
import torch
import torch.nn as nn

import vgc
from vgc.models import llama
from conftest import FP32_TOL


class TwoLayerMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_two_models_in_one_process_report_their_own_work(tmp_path, monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path))
    cfg = llama.tiny_config()
    decoder = llama.Llama(cfg)
    mlp = TwoLayerMLP()
    vgc.counters.reset()
    torch._dynamo.reset()

    with vgc.counters.delta() as total:
        first = vgc.compile(decoder)
        first.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
        after_first = first.stats()["model_counters"]
        second = vgc.compile(mlp)
        second.warmup(lambda n: (torch.randn(n, 8),))
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
    x = torch.randn(5, 8)
    torch.testing.assert_close(second(x), mlp(x), **FP32_TOL)


def test_a_second_trace_of_a_trace_once_model_is_refused(no_cache):
    model = TwoLayerMLP()
    compiled = vgc.compile(model)
    compiled(torch.randn(4, 8))
    torch._dynamo.reset()   # Dynamo forgets the code: the next call would trace again, before any warm-up
    with pytest.raises(vgc.CompileAfterWarmupError, match="already traced"):
        compiled(torch.randn(4, 8))
