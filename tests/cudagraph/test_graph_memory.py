"""Graph memory accounted and budgeted, and capture sizes chosen from recorded traffic, for `vgc.compile`'s
decoder graphs, end to end on the CPU stand-in for capture (`tests/simulated_graphs.py`: a captured graph's
outputs are its pool memory). `tests/test_gpu.py` checks the real pool on a GPU."""

import json
import logging

import pytest
import torch

import vgc
from vgc import cuda_runtime
from vgc.cudagraph.traffic import choose_sizes, load_profile, ProfileError
from vgc.models import llama
from conftest import FP32_TOL

SIZES = [1, 2, 4, 8, 16]


def compile_and_warm(model, cfg, kv, **config):
    compiled = vgc.compile(model, config=vgc.CompilationConfig(**config), pad_values=llama.PAD_VALUES,
                           uniform_decode=llama.is_uniform_decode)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
    return compiled, report


def check_equal_eager(compiled, model, cfg, kv, sizes=(1, 3, 5, 8, 13, 16)):
    with torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in sizes:
                out = compiled(**llama.make_batch(cfg, n, kind, kv_caches=kv)).clone()
                torch.testing.assert_close(out, model(**llama.make_batch(cfg, n, kind)), **FP32_TOL,
                                           msg=f"{kind} {n}")


@pytest.fixture
def unbudgeted(tiny, simulated_cuda, caplog):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    with caplog.at_level(logging.INFO, logger="vgc"):
        compiled, report = compile_and_warm(model, cfg, kv, cudagraph_mode="full_and_piecewise",
                                            cudagraph_capture_sizes=SIZES)
    return compiled, report, caplog.text


def test_graph_memory_is_reported_per_size_and_in_total(unbudgeted):
    compiled, report, log = unbudgeted
    memory = report["cudagraphs"]["graph_memory"]
    per_size = memory["per_size_bytes"]
    assert list(per_size) == sorted(SIZES, reverse=True)   # captured largest first
    assert memory["total_bytes"] == sum(per_size.values()) > 0 and memory["skipped_sizes"] == {}
    assert memory["peak_bytes"] >= memory["total_bytes"]
    # each size's graphs keep outputs that grow with the size: its share of the pool does too
    assert [per_size[s] for s in SIZES] == sorted(per_size[s] for s in SIZES)
    hidden = compiled.model.cfg.hidden_size * 4
    assert per_size[16] >= 16 * hidden   # the FULL graph's output alone is [16, hidden] fp32
    assert f"{memory['total_bytes'] / 2 ** 20:.1f} MiB of graph memory" in log


def test_a_memory_budget_keeps_the_largest_sizes_that_fit_and_every_call_still_runs(tiny, unbudgeted,
                                                                                     simulated_cuda):
    cfg, model = tiny
    _, report, _ = unbudgeted
    per_size = report["cudagraphs"]["graph_memory"]["per_size_bytes"]
    # the largest graph and a little more: the stand-in's first estimate is 0 (its runs allocate nothing it
    # sees), a GPU's is the peak memory of a run at that size
    budget = per_size[16] + 0.5 * per_size[8]
    kv = llama.make_kv_caches(cfg)
    compiled, report = compile_and_warm(model, cfg, kv, cudagraph_mode="full_and_piecewise",
                                        cudagraph_capture_sizes=SIZES, cudagraph_memory_budget_mb=budget / 2 ** 20)
    graphs = report["cudagraphs"]
    memory = graphs["graph_memory"]
    assert 0 < memory["total_bytes"] <= budget
    assert memory["skipped_sizes"] and all("past the budget" in why for why in memory["skipped_sizes"].values())
    assert 16 in graphs["capture_sizes"] and 8 in memory["skipped_sizes"]   # the largest first: every call up to it
    # still pads into a graph
    assert sorted([*graphs["capture_sizes"], *memory["skipped_sizes"]]) == SIZES
    with simulated_cuda.expect(cudagraph_captures=0, eager_runs=0) as d:
        check_equal_eager(compiled, model, cfg, kv)
    assert d["cudagraph_replays"] > 0


def test_running_out_of_memory_while_capturing_skips_that_size(tiny, simulated_cuda, monkeypatch):
    cfg, model = tiny
    capture, calls = cuda_runtime.capture, []

    def capture_or_fail(fn, pool):
        calls.append(1)
        if len(calls) == 2:   # FULL graphs only, largest first: the second capture is size 8
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return capture(fn, pool)

    monkeypatch.setattr(cuda_runtime, "capture", capture_or_fail)
    kv = llama.make_kv_caches(cfg)
    compiled, report = compile_and_warm(model, cfg, kv, cudagraph_mode="full", cudagraph_capture_sizes=SIZES)
    graphs = report["cudagraphs"]
    assert graphs["capture_sizes"] == [1, 2, 4, 16] and graphs["full_graphs"] == 4
    assert "out of memory" in graphs["graph_memory"]["skipped_sizes"][8]
    with simulated_cuda.expect(cudagraph_captures=0):
        check_equal_eager(compiled, model, cfg, kv, sizes=(1, 5, 8, 13))


def test_recorded_traffic_chooses_the_next_starts_capture_sizes(tiny, simulated_cuda, tmp_path):
    cfg, model = tiny
    path = tmp_path / "traffic.json"
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="none"),
                           uniform_decode=llama.is_uniform_decode, record=str(path))
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv))   # not traffic: not recorded
    served = {1: 7, 3: 5, 6: 2, 11: 1}
    with torch.no_grad():
        for n, times in served.items():
            for _ in range(times):
                compiled(**llama.make_batch(cfg, n, "decode", kv_caches=kv))
        compiled(**llama.make_batch(cfg, 9, "prefill", kv_caches=kv))
    compiled.recorder.flush()
    profile = load_profile(path, "decoder")
    assert profile.histograms == {"uniform_decode": served, "other": {9: 1}}
    assert json.loads(path.read_text())["kind"] == "decoder"

    kv = llama.make_kv_caches(cfg)
    compiled, report = compile_and_warm(model, cfg, kv, cudagraph_mode="full_and_piecewise",
                                        cudagraph_traffic_profile=str(path), cudagraph_max_graphs=3)
    chosen = choose_sizes({**served, 9: 1}, 3)
    assert report["cudagraphs"]["capture_sizes"] == chosen and chosen[-1] == 11
    with simulated_cuda.expect(cudagraph_captures=0, eager_runs=0):
        check_equal_eager(compiled, model, cfg, kv, sizes=(1, 2, 3, 6, 11))


def test_a_bad_profile_fails_vgc_compile_with_its_reason(tiny, tmp_path):
    _, model = tiny
    path = tmp_path / "traffic.json"
    path.write_text('{"vgc_traffic_profile": 1, "kind": "encoder", "histograms": {}}')
    with pytest.raises(ProfileError, match="records encoder traffic, but a decoder profile is needed"):
        vgc.compile(model, config=vgc.CompilationConfig(cudagraph_traffic_profile=str(path)))


def test_under_a_budget_with_a_profile_the_graphs_kept_are_the_ones_worth_the_most(tiny, unbudgeted,
                                                                                   simulated_cuda, tmp_path):
    cfg, model = tiny
    _, report, _ = unbudgeted
    per_size = report["cudagraphs"]["graph_memory"]["per_size_bytes"]
    path = tmp_path / "traffic.json"
    path.write_text(json.dumps({"vgc_traffic_profile": 1, "kind": "decoder",
                                "histograms": {"uniform_decode": {"1": 90, "2": 5, "9": 3, "16": 2}}}))
    kv = llama.make_kv_caches(cfg)
    # room for the largest graph and about two small ones: by size alone they would be 8 and 4
    budget = per_size[16] + 2.5 * per_size[1]
    compiled, report = compile_and_warm(model, cfg, kv, cudagraph_mode="full_and_piecewise",
                                        cudagraph_capture_sizes=SIZES, cudagraph_traffic_profile=str(path),
                                        cudagraph_memory_budget_mb=budget / 2 ** 20)
    memory = report["cudagraphs"]["graph_memory"]
    assert list(memory["per_size_bytes"])[:2] == [16, 1]   # the largest, then the most called
    assert memory["total_bytes"] <= budget and 8 in memory["skipped_sizes"]
    with simulated_cuda.expect(cudagraph_captures=0):
        check_equal_eager(compiled, model, cfg, kv, sizes=(1, 2, 9, 16))


def test_speculative_decoding_batches_replay_full_graphs(tiny, simulated_cuda):
    # k = 3 draft tokens: 4 tokens per sequence is the uniform decode shape; FULL graphs at the capture sizes
    # that are multiples of 4, each call padded to its graph's tokens and sequences
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full_and_piecewise",
                                                               cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32],
                                                               uniform_decode_query_len=4),
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.uniform_decode_of(4))
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv,
                                                                           query_len=4))
    assert report["cudagraphs"]["full_graphs"] == 4   # 4, 8, 16, 32 tokens: 1, 2, 4, 8 sequences
    with simulated_cuda.expect(cudagraph_captures=0, eager_runs=0) as d, torch.no_grad():
        for sequences in (1, 2, 3, 5, 7, 8):
            batch = llama.make_batch(cfg, 4 * sequences, "decode", kv_caches=kv, query_len=4)
            out = compiled(**batch).clone()
            eager_batch = llama.make_batch(cfg, 4 * sequences, "decode", query_len=4)
            torch.testing.assert_close(out, model(**eager_batch), **FP32_TOL, msg=f"{sequences} sequences")
            for cache, eager_cache in zip(kv, eager_batch["kv_caches"]):   # padded tokens wrote nothing
                torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
    assert d["cudagraph_replays"] == 6   # one FULL replay per call, no piece graphs
    with torch.no_grad():   # other batches still run their piece graphs
        out = compiled(**llama.make_batch(cfg, 13, "prefill", kv_caches=kv)).clone()
        torch.testing.assert_close(out, model(**llama.make_batch(cfg, 13, "prefill")), **FP32_TOL)
