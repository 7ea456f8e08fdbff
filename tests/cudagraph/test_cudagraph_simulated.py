"""The CUDA-graph runtime end to end on the CPU, with a stand-in for graph capture.

The stand-in keeps what matters about a real graph: a replay reads the tensors the graph was captured with,
in place, and writes into the same output tensors. A runtime that forgets to copy an input in, reads a buffer
that moved, or hands out memory the next replay overwrites fails these tests as it would on a GPU.
`tests/test_gpu.py` runs the real thing.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vgc
import vgc.backend
from vgc.models import llama
from conftest import FP32_TOL, hf_llama


CAPTURE_SIZES = [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise"])
def test_graph_modes_with_padding_equal_eager(mode, tiny, simulated_cuda):
    counters = simulated_cuda
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode=mode,
                                                               cudagraph_capture_sizes=CAPTURE_SIZES),
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
    graphs = report["cudagraphs"]
    assert graphs["full_graphs"] == (0 if mode == "piecewise" else len(CAPTURE_SIZES))
    assert graphs["piecewise_graphs"] == (0 if mode == "full" else 3 * len(CAPTURE_SIZES))
    with counters.expect(cudagraph_captures=0) as d, torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in (1, 3, 5, 8, 13, 31, 40):   # 40 is above every capture size
                out = compiled(**llama.make_batch(cfg, n, kind, kv_caches=kv)).clone()
                eager_batch = llama.make_batch(cfg, n, kind)
                torch.testing.assert_close(out, model(**eager_batch), **FP32_TOL, msg=f"{mode} {kind} {n}")
                for cache, eager_cache in zip(kv, eager_batch["kv_caches"]):   # padded tokens wrote nothing
                    torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
    assert d["cudagraph_replays"] > 0
    assert counters.dynamo_traces == 1


def test_dropin_captures_on_second_use_and_keeps_earlier_outputs(tiny, simulated_cuda):
    counters = simulated_cuda
    cfg, model = tiny
    compiled = torch.compile(model, backend="vgc", options={"cudagraph_capture_sizes": [8]})
    with torch.no_grad():
        outs = [compiled(**llama.make_batch(cfg, 8, "decode", seed=seed)) for seed in range(4)]
        for seed, out in enumerate(outs):
            torch.testing.assert_close(out, model(**llama.make_batch(cfg, 8, "decode", seed=seed)), **FP32_TOL)
    assert counters.cudagraph_captures == 3 and counters.cudagraph_replays == 6


class MutatesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, cache):
        cache.mul_(0.5).add_(self.proj(x))     # a compiled piece writes the caller's tensor in place
        return F.scaled_dot_product_attention(x[None], cache[None], cache[None])[0]


def test_inputs_written_in_place_are_never_replaced_by_copies(simulated_cuda):
    counters = simulated_cuda
    torch.manual_seed(0)
    model = MutatesItsInput()
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=["aten::scaled_dot_product_attention"],
                                                   cudagraph_capture_sizes=[8]))
    compiled = torch.compile(model, backend=backend)
    cache, eager_cache = torch.randn(8, 8), None
    eager_cache = cache.clone()
    with torch.no_grad():
        for step in range(4):   # the same cache every step: captured at step 2, replayed after
            x = torch.randn(8, 8)
            torch.testing.assert_close(compiled(x, cache), model(x, eager_cache), **FP32_TOL)
            torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
        assert counters.cudagraph_replays > 0
        other, other_eager = torch.randn(8, 8), None
        other_eager = other.clone()
        x = torch.randn(8, 8)
        with counters.expect(eager_runs=1):                           # a moved input runs without the graph
            torch.testing.assert_close(compiled(x, other), model(x, other_eager), **FP32_TOL)
        torch.testing.assert_close(other, other_eager, **FP32_TOL)   # written, not a stale copy


def test_debug_mode_catches_a_graph_reading_a_moved_buffer(tiny, simulated_cuda):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[4, 8],
                                                               debug=True),
                           pad_values=llama.PAD_VALUES)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
    with torch.no_grad():
        compiled(**llama.make_batch(cfg, 6, "decode", kv_caches=kv))   # sampled and compared: fine
        static = compiled.graphs.static.buffers
        static["input_ids"] = torch.zeros_like(static["input_ids"])   # graphs still read the old buffer
        with pytest.raises(RuntimeError, match="differs from the un-graphed run"):   # other token ids
            compiled(**llama.make_batch(cfg, 3, "decode", kv_caches=kv, seed=1))


def test_full_graph_rejects_a_kv_cache_at_another_address(tiny, simulated_cuda):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[4]),
                           pad_values=llama.PAD_VALUES)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
    with pytest.raises(vgc.InputMismatchError, match="kv_caches"):
        compiled(**llama.make_batch(cfg, 3, "decode"))


def test_hf_model_piece_graphs_copy_eager_attention_outputs_in(simulated_cuda):
    """SDPA allocates its output eagerly, outside any graph: the next piece's graph must copy it in."""
    pytest.importorskip("transformers")
    counters = simulated_cuda
    model = hf_llama(num_hidden_layers=2)
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=["aten::scaled_dot_product_attention"],
                                                   cudagraph_mode="piecewise"))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for step in range(4):   # one shape: warm-up, capture, then replays with new token ids
            ids = torch.randint(0, 128, (2, 7))
            out = compiled(input_ids=ids, use_cache=False).last_hidden_state
            torch.testing.assert_close(out, model(input_ids=ids, use_cache=False).last_hidden_state, **FP32_TOL)
    assert counters.cudagraph_captures == 3 and counters.cudagraph_replays == 2 * 3
