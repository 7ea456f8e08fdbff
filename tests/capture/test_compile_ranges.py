"""Compile ranges: `vgc.compile` traces once per interval of sizes the model's size conditions carve out, routes each
call by its contract, saves and loads each range's trace, and gives each range the capture sizes inside it."""

import pytest
import torch

import vgc
from vgc.capture import compile_ranges


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


def test_each_range_captures_the_graph_sizes_it_serves(simulated_cuda):
    model = Branchy()
    compiled = vgc.compile(model, {"compile_ranges_max_size": 64, "cudagraph_mode": "piecewise",
                                   "cudagraph_capture_sizes": [1, 4, 8, 16, 32, 48, 80]}, pad_values={"x": 0})
    report = compiled.warmup(_inputs)
    # Size 1 and sizes past the maximum go to the range whose checks take them, as calls do.
    assert [r.model.graphs.capture_sizes for r in compiled.ranges] == [[1, 4], [8, 16, 32], [48, 80]]
    assert report["compile_ranges"][1]["trace_size"] == 16
    for n, replayed in ((3, True), (6, False), (12, True), (40, False), (45, True), (70, True)):
        replays = vgc.counters.cudagraph_replays
        with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
            torch.testing.assert_close(compiled(_inputs(n)), model(_inputs(n)), atol=2e-5, rtol=2e-5)
        # 6 and 40 are past their range's largest capture size: no graph, and no padding into the next range.
        assert (vgc.counters.cudagraph_replays > replays) == replayed, n


class SplitBranchy(torch.nn.Module):
    """A piece before SDPA that is the same code on both sides of the condition after it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x):
        q, k, v = self.qkv(x).view(1, x.shape[0], 3, WIDTH).unbind(2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)[0]
        return y * 2 if x.shape[0] >= 8 else y - 1


def test_ranges_never_share_an_artifact_compiled_under_other_assumptions(cache_root, fresh_counters):
    """Inductor may rely on what the trace knew of a size (`x.size(0) >= 8`) without a guard of its own, so the
    same piece in two ranges is two artifacts, keyed by those facts."""
    model = SplitBranchy()
    compiled = vgc.compile(model, {"compile_ranges_max_size": 32,
                                   "splitting_ops": ["aten::scaled_dot_product_attention"]})
    compiled.warmup(_inputs)
    first_pieces = [r.model.backend.graphs[0].pieces[0] for r in compiled.ranges]
    keys = [r.model.backend.graphs[0].compiled[p.name].key for r, p in zip(compiled.ranges, first_pieces)]
    assert len(compiled.ranges) == 2 and keys[0] != keys[1]
    with torch.no_grad():
        for n in (3, 7, 8, 30):
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
