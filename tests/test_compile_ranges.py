"""Compile ranges: `vgc.compile` traces once per interval of sizes the model's size conditions carve out, routes each
call by its contract, saves and loads each range's trace, and gives each range the capture sizes inside it."""

import pytest
import torch

import vgc
from vgc import compile_ranges


class Branchy(torch.nn.Module):
    """Two size conditions: sizes 2-7, 8-40 and 41+ run different code. Its width (6) is its own: Inductor's kernel
    cache is process-wide, and a hit brings along the assumptions the hit artifact was compiled under (`x.size(0)
    >= 8` here), which would narrow another test's model of the same shape."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        y = self.lin(x)
        if x.shape[0] >= 8:
            y = y * 2
        if x.shape[0] > 40:
            y = y + 1
        return y


WIDTH = 6


def _inputs(n):
    return torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(n))


# ---- the interval search, on conditions given as predicates ----
@pytest.mark.parametrize("low, high, start, expect", [
    (8, 40, 16, (8, 40)), (2, 64, 16, (2, 64)), (16, 16, 16, (16, 16)), (9, 1000, 9, (9, 64)), (2, 17, 17, (2, 17)),
])
def test_interval_around_finds_the_edges_of_a_bounded_condition(low, high, start, expect):
    probed = []

    def accepts(n):
        probed.append(n)
        return low <= n <= high

    assert compile_ranges.interval_around(accepts, start, 2, 64) == expect
    assert all(2 <= n <= 64 for n in probed) and len(probed) <= 20   # galloping and bisection, not a scan


class _Traced:
    def __init__(self, low, high):
        self.low, self.high, self.trace_source = low, high, "traced"


def test_cover_traces_past_each_end_until_the_sizes_are_covered():
    bounds = [(2, 5), (6, 6), (7, 30), (31, 100)]   # the conditions of a model, as intervals
    traced_at = []

    def trace_at(n, index):
        traced_at.append((n, index))
        return _Traced(*next(b for b in bounds if b[0] <= n <= b[1]))

    accepts = lambda model, n: model.low <= n <= model.high  # noqa: E731
    ranges, uncovered = compile_ranges.cover(_Traced(7, 30), 16, 2, 64, accepts, trace_at)
    assert [(r.low, r.high) for r in ranges] == [(2, 5), (6, 6), (7, 30), (31, 64)] and uncovered == []
    assert traced_at == [(31, 1), (6, 2), (5, 3)]   # next to the covered sizes, each index once


def test_cover_reports_what_a_failed_trace_or_too_many_ranges_leave_uncovered():
    accepts = lambda model, n: model is not None and model.low <= n <= model.high  # noqa: E731
    ranges, uncovered = compile_ranges.cover(_Traced(10, 20), 15, 2, 30, accepts, lambda n, i: None)
    assert [(r.low, r.high) for r in ranges] == [(10, 20)] and uncovered == [(21, 30), (2, 9)]
    # Every size its own range (a divisibility condition, say): stops at MAX_RANGES traces.
    ranges, uncovered = compile_ranges.cover(_Traced(50, 50), 50, 2, 100, accepts, lambda n, i: _Traced(n, n))
    assert len(ranges) == compile_ranges.MAX_RANGES and uncovered


# ---- vgc.compile ----
@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_size_condition_without_ranges_names_the_fix(no_cache):
    compiled = vgc.compile(Branchy())
    compiled.warmup(_inputs)
    with pytest.raises(vgc.InputMismatchError, match="compile_ranges_max_size"):
        compiled(_inputs(4))


def test_ranges_equal_eager_on_every_side_traced_once_each_and_loaded_by_the_next_start(cache_root,
                                                                                        fresh_counters):
    model = Branchy()
    compiled = vgc.compile(model, {"compile_ranges_max_size": 64})
    report = compiled.warmup(_inputs)
    assert [r["sizes"] for r in report["compile_ranges"]] == [[2, 7], [8, 40], [41, 64]]
    assert vgc.counters.dynamo_traces == 3 and vgc.counters.traces_saved == 3
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        for n in (1, 2, 5, 7, 8, 9, 16, 40, 41, 64, 100):   # 1 and sizes past the maximum: whatever range accepts
            torch.testing.assert_close(compiled(_inputs(n)), model(_inputs(n)), atol=2e-5, rtol=2e-5)
    with pytest.raises(vgc.InputMismatchError, match="No compile range serves this call"):
        compiled(torch.randn(4, WIDTH + 1))   # a static dim no range was traced with

    again = vgc.compile(Branchy(), {"compile_ranges_max_size": 64})
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0):
        report = again.warmup(_inputs)
    assert [r["trace_source"] for r in report["compile_ranges"]] == ["saved"] * 3
    with torch.no_grad():
        for n in (3, 20, 50):
            torch.testing.assert_close(again(_inputs(n)), model(_inputs(n)), atol=2e-5, rtol=2e-5)


def test_each_range_captures_the_graph_sizes_inside_it(simulated_cuda):
    model = Branchy()
    compiled = vgc.compile(model, {"compile_ranges_max_size": 64, "cudagraph_mode": "piecewise",
                                   "cudagraph_capture_sizes": [4, 8, 16, 32, 48]}, pad_values={"x": 0})
    report = compiled.warmup(_inputs)
    by_range = [r.model.graphs.capture_sizes if r.model.graphs else [] for r in compiled.ranges]
    assert by_range == [[4], [8, 16, 32], [48]]
    assert report["compile_ranges"][1]["trace_size"] == 16
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        for n in (3, 4, 6, 12, 40, 45, 60):   # padded inside its range: 6 runs eagerly past 4, 45 pads to 48
            torch.testing.assert_close(compiled(_inputs(n)), model(_inputs(n)), atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
def test_ranges_capture_real_cuda_graphs_per_range():
    model = Branchy().cuda()
    compiled = vgc.compile(model, {"compile_ranges_max_size": 64, "cudagraph_mode": "piecewise",
                                   "cudagraph_capture_sizes": [4, 8, 16, 48], "cache_dir": None},
                           pad_values={"x": 0})
    compiled.warmup(lambda n: _inputs(n).cuda())
    assert [r.model.graphs.capture_sizes for r in compiled.ranges] == [[4], [8, 16], [48]]
    replays = vgc.counters.cudagraph_replays
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        for n in (3, 4, 12, 45):
            x = _inputs(n).cuda()
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert vgc.counters.cudagraph_replays > replays
