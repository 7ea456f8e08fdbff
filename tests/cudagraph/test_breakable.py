"""Breakable CUDA graphs (`vgc.cudagraph.breakable`): the eager forward captured in segments ended at each break,
with no Dynamo and no Inductor, on the CPU stand-in for capture.

The stand-in's segment records the operators the capture ran, on the tensors it ran them on, and a replay runs
exactly those again (no Python of the forward), writing each result into the tensor the capture produced: a
replay that reads a stale buffer, forgets a call's own sequence lengths, or misses a break's fresh result gives
a wrong answer here as on a GPU. tests/test_gpu.py captures real graphs.
"""

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vgc
from vgc.cudagraph import breakable, BreakableCaptureError
from vgc.cudagraph.breakable_capture import BreakableGraphs, DEFAULT_BREAKS
from vgc.models import llama
from conftest import FP32_TOL, hf_llama

SIZES = [1, 2, 4, 8, 16]
LLAMA_DIMS = {name: 0 for name in llama.PAD_VALUES}


def llama_graphs(model, cfg, kv, whole: bool, **kwargs):
    graphs = breakable(model, dynamic_arg_dims=LLAMA_DIMS, capture_sizes=SIZES, pad_values=llama.PAD_VALUES,
                       uniform_decode=llama.is_uniform_decode if whole else None, **kwargs)
    report = graphs.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv),
                           make_decode_inputs=(lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
                           if whole else None)
    return graphs, report


@pytest.mark.parametrize("whole", [False, True], ids=["breakable", "breakable+whole-decode"])
def test_reference_decoder_equals_eager_at_every_size(whole, tiny, simulated_capture, fresh_counters):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    with fresh_counters.expect(dynamo_traces=0, inductor_compiles=0):
        graphs, report = llama_graphs(model, cfg, kv, whole)
    # Two layers: attention ends the first two segments; each size is three segments and two eager calls.
    assert report["segments"] == {n: 3 for n in SIZES} and report["breaks"] == {n: 2 for n in SIZES}
    assert report["whole_graph_sizes"] == (SIZES if whole else [])
    with fresh_counters.expect(dynamo_traces=0, inductor_compiles=0, cudagraph_captures=0) as d, torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in (1, 3, 5, 8, 13, 16, 20):   # 20 is above every capture size: eager
                out = graphs(**llama.make_batch(cfg, n, kind, kv_caches=kv)).clone()
                eager_batch = llama.make_batch(cfg, n, kind)
                torch.testing.assert_close(out, model(**eager_batch), **FP32_TOL, msg=f"{kind} {n}")
                for cache, eager_cache in zip(kv, eager_batch["kv_caches"]):   # padded tokens wrote nothing
                    torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
    assert d["cudagraph_replays"] == 12 and d["eager_runs"] == 2


def test_prefill_batches_of_other_shapes_replay_one_size(tiny, simulated_capture, fresh_counters):
    """Sequence inputs only attention reads: a size's graphs serve any number of sequences, the call's own lengths
    reaching the eager attention (captured with 4 sequences, served with 1 and 3)."""
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    graphs, _ = llama_graphs(model, cfg, kv, whole=False)

    def batch(lengths, kv_caches):
        # sequences of the given lengths, from position 0, in consecutive blocks
        block_table = torch.zeros(len(lengths), cfg.max_blocks_per_seq, dtype=torch.int32)
        slots, positions, start = [], [], 0
        for b, n in enumerate(lengths):
            blocks = -(-n // cfg.block_size)
            block_table[b, :blocks] = torch.arange(start, start + blocks)
            slots += [(start + p // cfg.block_size) * cfg.block_size + p % cfg.block_size for p in range(n)]
            positions += list(range(n))
            start += blocks
        return {"input_ids": torch.arange(sum(lengths)) % cfg.vocab_size, "positions": torch.tensor(positions),
                "kv_caches": kv_caches, "slot_mapping": torch.tensor(slots), "block_table": block_table,
                "seq_lens": torch.tensor(lengths, dtype=torch.int32),
                "query_start_loc": torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)}

    with fresh_counters.expect(eager_runs=0) as d, torch.no_grad():
        for lengths in ([16], [5, 11], [3, 3, 2], [7]):
            for cache in kv:
                cache.zero_()
            out = graphs(**batch(lengths, kv)).clone()
            torch.testing.assert_close(out, model(**batch(lengths, llama.make_kv_caches(cfg))), **FP32_TOL,
                                       msg=str(lengths))
    assert d["cudagraph_replays"] == 4


# ---- what a replay cannot repeat ----------------------------------------------------------------------------------

class Stack(nn.Module):
    """A user's model: SDPA blocks, and between them a `probe(x, i)` that subclasses override."""

    def __init__(self, layers: int = 3, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.width = width

    def probe(self, x, i):
        return x

    def forward(self, x):
        n = x.shape[0]
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = qkv(x).view(1, n, 3, 2, self.width // 2).permute(2, 0, 3, 1, 4)
            x = x + out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, -1))
            x = self.probe(x, i)
        return x


class ItemBetweenLayers(Stack):
    def probe(self, x, i):
        return x * 2 if x.abs().max().item() > 1e6 else x


class TolistBetweenLayers(Stack):
    def probe(self, x, i):
        return x + len([v for v in x[0].tolist() if v > 0]) * 0


class NonzeroBetweenLayers(Stack):
    def probe(self, x, i):
        return x + torch.nonzero(x > 0).shape[0] * 0


class PrintsTensor(Stack):
    def probe(self, x, i):
        print(x.sum())
        return x


@pytest.mark.parametrize("model_cls, what", [(ItemBetweenLayers, ".item()"), (TolistBetweenLayers, "tolist"),
                                             (NonzeroBetweenLayers, "nonzero"), (PrintsTensor, "printing")])
def test_host_read_inside_a_segment_is_refused_at_capture(model_cls, what, simulated_capture):
    graphs = breakable(model_cls().eval(), dynamic_arg_dims={"x": 0}, capture_sizes=[4])
    with pytest.raises(BreakableCaptureError) as error:
        graphs.warmup(lambda n: (torch.randn(n, 16),))
    message = str(error.value)
    assert what in message and "breaks=" in message and __file__ in message   # the user's line, and the fix


class Monitor(nn.Module):
    """Statistics read on the host: fine in a break, which runs (Python and all) at every replay."""

    def __init__(self):
        super().__init__()
        self.seen: list[float] = []

    def forward(self, x):
        self.seen.append(x.abs().max().item())
        return x


class Monitored(Stack):
    def __init__(self):
        super().__init__()
        self.monitors = nn.ModuleList(Monitor() for _ in range(len(self.qkv)))

    def probe(self, x, i):
        return self.monitors[i](x)


def test_module_break_runs_its_python_at_every_replay(simulated_capture, fresh_counters):
    model = Monitored().eval()
    graphs = breakable(model, dynamic_arg_dims={"x": 0}, capture_sizes=[4, 8], pad_values={"x": 0},
                       breaks=[*DEFAULT_BREAKS, Monitor])
    report = graphs.warmup(lambda n: (torch.randn(n, 16),))
    assert report["breaks"] == {4: 6, 8: 6}   # three SDPA calls and three monitors per size
    reference = Monitored().eval()
    with fresh_counters.expect(cudagraph_replays=3, eager_runs=0), torch.no_grad():
        for n in (3, 8, 4):
            x = torch.randn(n, 16)
            before = len(model.monitors[0].seen)
            torch.testing.assert_close(graphs(x), reference(x), **FP32_TOL)
            # each monitor saw this call's values (the padded row included: pad value 0 adds a row of its own)
            assert len(model.monitors[0].seen) == before + 1
            assert model.monitors[2].seen[-1] >= reference.monitors[2].seen[-1] - 1e-5


class GraphBroken(Stack):
    """Dynamo cannot take this forward whole (a print and an explicit graph break between layers)."""

    def probe(self, x, i):
        print(f"layer {i} done")
        torch._dynamo.graph_break()
        return torch.tanh(x)


def test_graph_broken_model_gets_one_capture_per_size(simulated_capture, fresh_counters, capsys):
    model = GraphBroken().eval()
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=["aten::scaled_dot_product_attention"]))
    x = torch.randn(8, 16)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), want, **FP32_TOL)
    # Dynamo (a graph break inside the layer loop) gives no graph of the whole step: none holds the three SDPAs
    assert backend.graphs and all(sum(p.is_splitting for p in g.pieces) < 3 for g in backend.graphs)
    graphs = breakable(model, dynamic_arg_dims={"x": 0}, capture_sizes=[8])
    report = graphs.warmup(lambda n: (torch.randn(n, 16),))
    assert report["segments"] == {8: 4} and report["breaks"] == {8: 3}   # the breaks are the SDPA calls only
    capsys.readouterr()
    with torch.no_grad():
        torch.testing.assert_close(graphs(x), want, **FP32_TOL)
    assert "layer" not in capsys.readouterr().out   # a replay runs no Python of the forward


# ---- a break feeding a break: a cache that grows ------------------------------------------------------------------

class GrowingCache(nn.Module):
    """A dynamic KV cache: returns every key so far, one more per call (as transformers' DynamicCache does)."""

    def __init__(self):
        super().__init__()
        self.keys = None

    def forward(self, k):
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        return self.keys


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.out = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.cache = GrowingCache()

    def forward(self, x):   # x: [batch, 16], one token per sequence
        b = x.shape[0]
        q = self.q(x).view(b, 2, 1, 8)
        keys = self.cache(self.k(x).view(b, 2, 1, 8))
        return x + self.out(F.scaled_dot_product_attention(q, keys, keys).reshape(b, 16))


def test_break_results_feed_later_breaks_whatever_their_length(simulated_capture, fresh_counters):
    """The cache update and attention are breaks: each replay hands attention the update's fresh, longer keys, so
    one graph per size serves every KV length."""
    model, reference = Decoder().eval(), Decoder().eval()
    graphs = breakable(model, dynamic_arg_dims={"x": 0}, capture_sizes=[4],
                       breaks=[*DEFAULT_BREAKS, GrowingCache])
    graphs.warmup(lambda n: (torch.zeros(n, 16),))
    model.cache.keys = None   # warm-up and capture appended two steps; start a fresh sequence
    with fresh_counters.expect(cudagraph_replays=5, eager_runs=0), torch.no_grad():
        for step in range(5):
            x = torch.randn(4, 16)
            torch.testing.assert_close(graphs(x), reference(x), **FP32_TOL, msg=f"step {step}")
    assert model.cache.keys.shape[2] == 5


class ObjectCache:
    """A cache that is no module: a new one per sequence, passed to every call (as generate() passes its
    DynamicCache); its `update` copies what it keeps."""

    def __init__(self):
        self.keys = None

    def update(self, k):
        self.keys = k.clone() if self.keys is None else torch.cat([self.keys, k], dim=2)
        return self.keys


class PassedCacheDecoder(Decoder):
    def forward(self, x, cache):
        b = x.shape[0]
        q = self.q(x).view(b, 2, 1, 8)
        keys = cache.update(self.k(x).view(b, 2, 1, 8))
        return x + self.out(F.scaled_dot_product_attention(q, keys, keys).reshape(b, 16))


def object_cache_graphs(model_cls, cache_cls=ObjectCache):
    graphs = breakable(model_cls().eval(), dynamic_arg_dims={"x": 0}, capture_sizes=[4],
                       breaks=[*DEFAULT_BREAKS, cache_cls.update])
    graphs.warmup(lambda n: (torch.zeros(n, 16), cache_cls()))
    return graphs


def test_method_break_gets_each_calls_own_cache_object(simulated_capture, fresh_counters):
    """A method break (the cache's update, patched on its class during capture) receives, at every replay, the
    cache object of this call: two sequences, each its own cache, replay one capture."""
    graphs, reference = object_cache_graphs(PassedCacheDecoder), PassedCacheDecoder().eval()
    assert graphs.stats()["handed_over"] == ["cache"]
    with fresh_counters.expect(cudagraph_replays=8, eager_runs=0), torch.no_grad():
        for sequence in range(2):
            ours, theirs = ObjectCache(), ObjectCache()
            for step in range(4):
                x = torch.randn(4, 16)
                torch.testing.assert_close(graphs(x, ours), reference(x, theirs), **FP32_TOL,
                                           msg=f"sequence {sequence}, step {step}")
            assert ours.keys.shape[2] == 4
    assert ObjectCache.update.__qualname__ == "ObjectCache.update"   # unpatched after capture


class ReadsHeldKeys(PassedCacheDecoder):
    def forward(self, x, cache):
        seen = cache.keys.mean() if cache.keys is not None else 0.0   # a tensor the cache holds, from an earlier call
        return super().forward(x, cache) + seen


class KeepsItsArgument(ObjectCache):
    def update(self, k):
        self.last = k   # a reference to graph memory, which the next replay overwrites
        return super().update(k)


@pytest.mark.parametrize("model_cls, cache_cls, message", [
    (ReadsHeldKeys, ObjectCache, "reads a tensor that argument 'cache' .* holds"),
    (PassedCacheDecoder, KeepsItsArgument, "KeepsItsArgument.update keeps a tensor argument"),
])
def test_handed_over_objects_that_cannot_be_right_are_refused(model_cls, cache_cls, message, simulated_capture):
    with pytest.raises(BreakableCaptureError, match=message):
        object_cache_graphs(model_cls, cache_cls)


class ReadsTheCache(Decoder):
    def forward(self, x):
        b = x.shape[0]
        keys = self.cache(self.k(x).view(b, 2, 1, 8))
        return x + keys.mean(dim=2).reshape(b, 16)   # a segment reads the growing result


def test_segment_reading_a_break_result_of_another_shape_raises(simulated_capture):
    model = ReadsTheCache().eval()
    graphs = breakable(model, dynamic_arg_dims={"x": 0}, capture_sizes=[4], breaks=[GrowingCache])
    graphs.warmup(lambda n: (torch.zeros(n, 16),))
    with pytest.raises(RuntimeError, match="captured as .* a captured segment reads it"), torch.no_grad():
        graphs(torch.randn(4, 16))


# ---- calls a graph cannot serve ------------------------------------------------------------------------------------

def test_moved_cache_or_other_constant_runs_eagerly_with_the_right_answer(tiny, simulated_capture, fresh_counters,
                                                                           caplog):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    graphs, _ = llama_graphs(model, cfg, kv, whole=False)
    with fresh_counters.expect(cudagraph_replays=0, eager_runs=1), torch.no_grad():
        moved = llama.make_batch(cfg, 8, "decode")   # fresh KV caches: not the captured addresses
        torch.testing.assert_close(graphs(**moved), model(**llama.make_batch(cfg, 8, "decode")), **FP32_TOL)
    assert "not at the address it was captured with" in caplog.text

    scaled = breakable(Scaled().eval(), dynamic_arg_dims={"x": 0}, capture_sizes=[4])
    scaled.warmup(lambda n: (torch.ones(n, 16), 2.0))
    with fresh_counters.expect(cudagraph_replays=1, eager_runs=1), torch.no_grad():
        torch.testing.assert_close(scaled(torch.ones(4, 16), 2.0), torch.full((4, 16), 2.0))
        torch.testing.assert_close(scaled(torch.ones(4, 16), 3.0), torch.full((4, 16), 3.0))
    assert "scale is 3.0, captured as 2.0" in caplog.text


class Scaled(nn.Module):
    def forward(self, x, scale):
        return x * scale


class OptionalBias(nn.Module):
    def forward(self, x, bias=None, **options):
        out = x * 2
        if bias is not None:
            out = out + bias
        return out * options.get("gain", 1.0)


def test_an_argument_the_capture_did_not_have_runs_eagerly(simulated_capture, fresh_counters, caplog):
    """Captured without the optional arguments: a call passing one is not the captured call (a replay would drop
    it), so it runs eagerly, right; a call passing the defaults replays."""
    graphs = breakable(OptionalBias().eval(), dynamic_arg_dims={"x": 0}, capture_sizes=[4])
    graphs.warmup(lambda n: (torch.ones(n, 16),))
    x, bias = torch.ones(4, 16), torch.full((4, 16), 5.0)
    with fresh_counters.expect(cudagraph_replays=2, eager_runs=2), torch.no_grad():
        torch.testing.assert_close(graphs(x), x * 2)
        torch.testing.assert_close(graphs(x, None), x * 2)
        torch.testing.assert_close(graphs(x, bias), x * 2 + bias)
        torch.testing.assert_close(graphs(x, gain=3.0), x * 6)
    assert "bias is a torch.float32 tensor of shape (4, 16) on cpu, captured as None" in caplog.text
    assert "options is structured as" in caplog.text


def test_unmodified_transformers_model_equals_eager(simulated_capture, fresh_counters):
    """transformers' Llama, unmodified, no cache: sequence lengths padded up to 8 or 16 (causal attention: padded
    tokens at the end change no real one), its SDPA calls the breaks."""
    model = hf_llama(2)
    graphs = breakable(model, dynamic_arg_dims={"input_ids": 1}, capture_sizes=[8, 16], pad_values={"input_ids": 0})
    with fresh_counters.expect(dynamo_traces=0, inductor_compiles=0):
        report = graphs.warmup(lambda n: {"input_ids": torch.randint(128, (1, n)), "use_cache": False})
    assert report["breaks"] == {8: 2, 16: 2}
    with fresh_counters.expect(cudagraph_replays=3, eager_runs=0), torch.no_grad():
        for n in (5, 8, 13):
            ids = torch.randint(128, (1, n))
            out = graphs(input_ids=ids, use_cache=False).last_hidden_state
            torch.testing.assert_close(out, model(input_ids=ids, use_cache=False).last_hidden_state, **FP32_TOL)


@pytest.mark.parametrize("kwargs, message", [
    ({"dynamic_arg_dims": {}}, "dynamic_arg_dims must name"),
    ({"dynamic_arg_dims": {"tokens": 0}}, "does not take"),
    ({"dynamic_arg_dims": {"x": "0"}}, "must be a dim"),
    ({"dynamic_arg_dims": {"x": 0}, "pad_values": {"y": 0}}, "not in dynamic_arg_dims"),
    ({"dynamic_arg_dims": {"x": 0}, "breaks": [lambda x: x]}, "cannot be seen by the capture"),
    ({"dynamic_arg_dims": {"x": 0}, "breaks": ["attention"]}, "operator names look like"),
    ({"dynamic_arg_dims": {"x": 0}, "capture_sizes": [0]}, "positive ints"),
])
def test_bad_arguments_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        breakable(Stack(), **kwargs)


def test_inputs_of_the_wrong_size_are_refused_at_warmup(simulated_capture):
    graphs = breakable(Stack(), dynamic_arg_dims={"x": 0}, capture_sizes=[4])
    with pytest.raises(ValueError, match="make_inputs\\(n\\) must make calls of size n"):
        graphs.warmup(lambda n: (torch.randn(n + 1, 16),))


def test_break_arguments_rebuild_as_pytree_would():
    """A replay rebuilds each break's (args, kwargs) by a plan made at capture: plain tuples, lists, dicts and Nones
    by the plan, anything else pytree knows (a named tuple) by pytree; both give back the structure."""
    import collections

    from vgc import _compat
    from vgc.cudagraph.segments import _builder

    point = collections.namedtuple("Point", "x y")
    t = torch.ones(2)
    for structure in [((t, 3, None), {"kwargs": {"mask": t, "flag": False}, "extra": [t, (t,)]}),
                      ((point(t, t),), {"p": point(1, t)})]:
        leaves, spec = _compat.tree_flatten(structure)
        fresh = [torch.full((2,), float(i)) if isinstance(x, torch.Tensor) else x for i, x in enumerate(leaves)]
        rebuilt = _builder(structure, leaves, spec)(fresh)
        again, rebuilt_spec = _compat.tree_flatten(rebuilt)
        assert rebuilt_spec == spec and all(a is b for a, b in zip(again, fresh))
    # the plan is taken only where it is pytree's: a plain structure uses it, a named tuple does not
    assert _builder(((t, None), {"a": [t]}), *_compat.tree_flatten(((t, None), {"a": [t]}))).__code__ is not \
        _builder((point(t, t),), *_compat.tree_flatten((point(t, t),))).__code__


@pytest.mark.parametrize("on_demand", [False, True], ids=["warmup", "on-demand"])
def test_inputs_where_no_graph_runs_are_served_eagerly_even_when_torch_hands_out_a_pool(on_demand, tiny, monkeypatch,
                                                                                        fresh_counters, caplog):
    """A CUDA build of torch on a machine without a driver hands out a graph pool, and only its first synchronize
    fails: the inputs' device is asked first, so CPU inputs run eagerly (one warning), never reaching a device call."""
    from vgc import cuda_runtime

    monkeypatch.setattr(cuda_runtime, "new_pool", lambda: object())   # what such a torch returns

    def no_driver(*args):
        raise AssertionError("a device call was made for CPU inputs")

    for name in ("synchronize", "reserved_bytes", "reset_peak_memory", "peak_reserved_bytes", "capture"):
        monkeypatch.setattr(cuda_runtime, name, no_driver)
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    graphs = breakable(model, dynamic_arg_dims=LLAMA_DIMS, capture_sizes=SIZES, pad_values=llama.PAD_VALUES)
    with caplog.at_level(logging.WARNING, logger="vgc"), torch.no_grad():
        if on_demand:
            graphs.capture_on_demand = True
        else:
            assert graphs.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv))["capture_sizes"] == []
        for n in (3, 4, 4):
            torch.testing.assert_close(graphs(**llama.make_batch(cfg, n, "decode", kv_caches=kv)),
                                       model(**llama.make_batch(cfg, n, "decode")), **FP32_TOL)
    assert "where no CUDA graph runs: calls run eagerly" in caplog.text
    assert graphs.counters.as_dict()["eager_runs"] == 3 and not graphs.capture_on_demand


def test_growing_dims_are_read_from_calls_at_two_sizes():
    """What a tiered start's first tier pads, from make_inputs: the token inputs grow in a prefill, the
    per-sequence ones too in a decode batch; the call's size first."""
    from vgc.cudagraph.breakable_capture import growing_dims

    cfg = llama.tiny_config()
    kv = llama.make_kv_caches(cfg)
    pair = lambda kind: tuple(llama.make_batch(cfg, n, kind, kv_caches=kv) for n in (16, 17))   # noqa: E731
    prefill = growing_dims([pair("prefill")], 16)
    assert prefill == {"input_ids": 0, "positions": 0, "slot_mapping": 0}
    both = growing_dims([pair("prefill"), pair("decode")], 16)
    assert next(iter(both)) == "input_ids" and set(both) == set(llama.PAD_VALUES)
    assert all(d == 0 for d in both.values())
    square = {"x": torch.zeros(16, 16)}, {"x": torch.zeros(17, 17)}   # grows in two dims: no single one
    assert growing_dims([square], 16) is None
    across = {"x": torch.zeros(16, 3)}, {"x": torch.zeros(17, 3)}
    along = {"x": torch.zeros(3, 16)}, {"x": torch.zeros(3, 17)}
    assert growing_dims([across, along], 16) is None   # two kinds of call disagree on the dim


def test_on_demand_a_refused_capture_turns_capture_off_and_serves_eagerly(simulated_capture, caplog):
    """A tiered start's first tier captures while serving: a forward a graph cannot hold (a host read inside a
    segment) answers that call eagerly, warns once, and captures nothing after (never the wrong answer)."""
    model = ItemBetweenLayers().eval()
    graphs = BreakableGraphs(model, dynamic_arg_dims={"x": 0}, capture_sizes=[4, 8], pad_values={"x": 0},
                             capture_on_demand=True)
    with caplog.at_level(logging.WARNING, logger="vgc"), torch.no_grad():
        for n in (3, 3, 5, 4):
            x = torch.randn(n, 16)
            torch.testing.assert_close(graphs(x), model(x), **FP32_TOL)
    assert not graphs.capture_on_demand and graphs.graphs == {}
    assert graphs.counters.as_dict()["eager_runs"] == 4
    assert caplog.text.count("no graphs for this model") == 1 and ".item()" in caplog.text
