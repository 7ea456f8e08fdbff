"""Drop-in `torch.compile(model, backend="vgc")` with FULL CUDA graphs, on the CPU through the capture stand-in
(`conftest.simulated_capture`: a replay re-runs the captured code on the captured tensors, so a stale read or an
output overwritten by the next call shows as a wrong value). `tests/test_gpu.py` runs the same on CUDA."""

import logging

import pytest
import torch
import torch.nn as nn

import vgc
from vgc import cuda_runtime
from vgc.cudagraph.dropin import MAX_RECAPTURES, REPLAYS_PER_CAPTURE
from vgc.models import llama
from conftest import FP32_TOL


def _dropin(model, mode, sizes=(8,), **options):
    return torch.compile(model, backend="vgc", options={"cudagraph_mode": mode,
                                                        "cudagraph_capture_sizes": list(sizes), **options})


def _check_step(cfg, model, compiled, n, kind, kv, seed):
    """One call: equals eager, and wrote the same KV cache entries as eager (in the caller's cache)."""
    out = compiled(**llama.make_batch(cfg, n, kind, kv_caches=kv, seed=seed))
    eager_batch = llama.make_batch(cfg, n, kind, seed=seed)
    torch.testing.assert_close(out, model(**eager_batch), **FP32_TOL, msg=f"{kind} {n} seed {seed}")
    for cache, eager_cache in zip(kv, eager_batch["kv_caches"]):
        torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
    return out


def _steps(tiny, mode: str, kind: str, seeds: int):
    """The tiny Llama under drop-in `mode`, `seeds` checked calls of 8 tokens of `kind`; (cfg, model, compiled,
    its KV caches)."""
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = _dropin(model, mode)
    with torch.no_grad():
        for seed in range(seeds):
            _check_step(cfg, model, compiled, 8, kind, kv, seed)
    return cfg, model, compiled, kv


@pytest.mark.parametrize("mode", ["full", "full_and_piecewise"])
def test_full_graph_replays_new_inputs_and_writes_the_callers_kv_cache(mode, tiny, simulated_cuda):
    counters = simulated_cuda
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = _dropin(model, mode)
    with torch.no_grad():
        for seed in range(4):   # warm-up, capture, then replays of new input tensors (other ids, cache contents)
            _check_step(cfg, model, compiled, 8, "decode", kv, seed)
    assert counters.cudagraph_captures == 1   # one FULL graph, no piece graphs
    assert counters.cudagraph_replays == 2    # the two calls after the capture
    assert counters.dynamo_traces == 1


def test_outputs_stay_valid_after_the_next_call(tiny, simulated_cuda):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = _dropin(model, "full")
    with torch.no_grad():
        outs = [compiled(**llama.make_batch(cfg, 8, "decode", kv_caches=kv, seed=seed)) for seed in range(4)]
        for seed, out in enumerate(outs):   # no clone by the caller: earlier replays' outputs were not overwritten
            torch.testing.assert_close(out, model(**llama.make_batch(cfg, 8, "decode", seed=seed)), **FP32_TOL)


def test_a_moved_kv_cache_runs_without_the_graph_then_captures_again(tiny, simulated_cuda, caplog):
    counters = simulated_cuda
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = _dropin(model, "full")
    caplog.set_level(logging.INFO, logger="vgc")
    with torch.no_grad():
        for seed in range(3):
            _check_step(cfg, model, compiled, 8, "decode", kv, seed)
        assert counters.cudagraph_captures == 1
        other = llama.make_kv_caches(cfg)
        with counters.expect(eager_runs=1, cudagraph_captures=0):   # the graph would write the old cache
            _check_step(cfg, model, compiled, 8, "decode", other, 5)
        assert "kv_caches" in caplog.text and "not at the address" in caplog.text
        with counters.expect(cudagraph_captures=1):                 # captured again at the new address
            _check_step(cfg, model, compiled, 8, "decode", other, 6)
        with counters.expect(cudagraph_captures=0, eager_runs=0):
            _check_step(cfg, model, compiled, 8, "decode", other, 7)


def test_inputs_that_keep_moving_stop_being_captured(tiny, simulated_cuda, caplog):
    counters = simulated_cuda
    cfg, model = tiny
    compiled = _dropin(model, "full")
    kv = llama.make_kv_caches(cfg)
    with torch.no_grad():
        for seed in range(3 + 2 * (MAX_RECAPTURES + 2)):   # new caches on every other call
            if seed % 2 == 0:
                kv = llama.make_kv_caches(cfg)
            _check_step(cfg, model, compiled, 8, "decode", kv, seed)
    assert counters.cudagraph_captures == 1 + MAX_RECAPTURES
    assert f"moved {MAX_RECAPTURES + 1} times" in caplog.text


def test_inputs_that_move_once_per_generate_keep_their_graph(tiny, simulated_cuda, caplog):
    """transformers allocates a new StaticCache per generate(): its K/V move once, then every decode step reads
    them in place. A move after REPLAYS_PER_CAPTURE replays does not count towards giving up."""
    counters = simulated_cuda
    cfg, model = tiny
    compiled = _dropin(model, "full")
    rounds = MAX_RECAPTURES + 2
    with torch.no_grad():
        for round_ in range(rounds):
            kv = llama.make_kv_caches(cfg)
            for step in range(REPLAYS_PER_CAPTURE + 2):   # one call without the graph, a capture, then replays
                _check_step(cfg, model, compiled, 8, "decode", kv, step)
    assert counters.cudagraph_captures == rounds
    assert counters.cudagraph_replays == rounds * REPLAYS_PER_CAPTURE
    assert "without a FULL graph" not in caplog.text


@pytest.mark.parametrize("mode", ["full", "full_and_piecewise"])
def test_a_batch_attention_cannot_capture_falls_back_to_piecewise_graphs(mode, tiny, simulated_cuda, caplog):
    """vgc::attention refuses to be captured for prefill of more than 16 tokens per sequence (attending them
    without a host sync would gather keys per token): that signature runs on piece graphs, with one warning
    naming the op; decode batches still get their FULL graph."""
    counters = simulated_cuda
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = _dropin(model, mode, sizes=(72,))
    caplog.set_level(logging.WARNING, logger="vgc")
    with torch.no_grad():
        for seed in range(4):
            _check_step(cfg, model, compiled, 72, "prefill", kv, seed)   # 4 sequences of 18 tokens
        warnings = [r.getMessage() for r in caplog.records if "capture failed" in r.getMessage()]
        assert len(warnings) == 1 and "vgc::attention" in warnings[0] and "PIECEWISE" in warnings[0]
        assert counters.cudagraph_captures == 3   # the three compiled pieces, each with its own graph
        with counters.expect(cudagraph_captures=1):
            for seed in range(3):
                _check_step(cfg, model, compiled, 72, "decode", kv, seed)


def test_a_few_tokens_per_sequence_get_a_full_graph(tiny, simulated_cuda):
    """A short prefill (4 sequences of 2 tokens, the shape of speculative decoding with one draft token) is
    captured whole: attention finds each token's sequence on the device."""
    counters = simulated_cuda
    _steps(tiny, "full", "prefill", seeds=4)
    assert counters.cudagraph_captures == 1 and counters.cudagraph_replays == 2


def test_sizes_outside_the_capture_list(tiny, simulated_cuda):
    """FULL runs them without graphs; FULL_AND_PIECEWISE on piece graphs where the pieces' size is a capture size."""
    counters = simulated_cuda
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = _dropin(model, "full", sizes=(4,))
    with torch.no_grad():
        for n in (4, 6, 6, 6):   # 4 compiles a static graph, 6 a symbolic one: size 6 is not a capture size
            _check_step(cfg, model, compiled, n, "decode", kv, n)
    assert counters.cudagraph_captures == 0 and counters.eager_runs == 4


# ---- ops a graph cannot hold ----

@torch.library.custom_op("vgc_test::host_sync", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def host_sync(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@host_sync.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("vgc_test::syncs_when_captured", mutates_args=())
def syncs_when_captured(x: torch.Tensor) -> torch.Tensor:
    if cuda_runtime.stream_capturing():   # what a .item() inside a real capture does
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    return x * 2


@syncs_when_captured.register_fake
def _(x):
    return torch.empty_like(x)


class CallsAnOp(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.op(torch.relu(self.up(x)))) + x


@pytest.mark.parametrize("op, named", [(host_sync, "vgc_test::host_sync"),
                                       (syncs_when_captured, "operation not permitted")])
def test_an_op_a_graph_cannot_hold_gives_piecewise_graphs_and_one_warning(op, named, simulated_cuda, caplog):
    counters = simulated_cuda
    torch.manual_seed(0)
    model = CallsAnOp(op)
    compiled = _dropin(model, "full", splitting_ops=[str(op._opoverload.name())])
    caplog.set_level(logging.WARNING, logger="vgc")
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(8, 8)
            torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    warnings = [r.getMessage() for r in caplog.records if "FULL" in r.getMessage()]
    assert len(warnings) == 1 and named in warnings[0] and "PIECEWISE" in warnings[0]
    assert counters.cudagraph_captures == 2   # the pieces before and after the op
    assert counters.cudagraph_replays > 0


def _bad_ids(batch, cfg):
    batch["input_ids"][0] = cfg.vocab_size + 3
    return batch


def test_a_full_graph_replay_checks_token_ids_first(tiny, simulated_cuda):
    """A replay skips the compiled forward, so the id check sits outside the graphs: an id outside the embedding is
    an IndexError (the compiled kernel would abort the process on CPU, and poison the CUDA context on a GPU)."""
    cfg, model, compiled, kv = _steps(tiny, "full", "decode", seeds=3)
    with torch.no_grad():
        with pytest.raises(IndexError, match="input_ids holds ids"):
            compiled(**_bad_ids(llama.make_batch(cfg, 8, "decode", kv_caches=kv), cfg))
        _check_step(cfg, model, compiled, 8, "decode", kv, 4)


def test_vgc_compile_full_replay_checks_token_ids_first(tiny, simulated_cuda):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[4, 8]),
                           pad_values=llama.PAD_VALUES)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
    with torch.no_grad(), simulated_cuda.expect(cudagraph_replays=0):
        with pytest.raises(IndexError, match="input_ids holds ids"):
            compiled(**_bad_ids(llama.make_batch(cfg, 6, "decode", kv_caches=kv), cfg))
    with torch.no_grad():
        _check_step(cfg, model, compiled, 6, "decode", kv, 1)


class TwoDynamicDims(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):   # x: [batch, length, 8]
        return self.proj(x).softmax(dim=1)


def test_at_most_one_full_graph_per_capture_size(simulated_cuda, caplog):
    """Shapes with a second symbolic size (a length) could each get a graph: the count stops at the number of
    capture sizes, and later shapes run without one (FULL) after one warning."""
    counters = simulated_cuda
    torch.manual_seed(0)
    model = TwoDynamicDims()
    compiled = _dropin(model, "full", sizes=(2, 4))
    caplog.set_level(logging.WARNING, logger="vgc")
    with torch.no_grad():
        for batch, length in [(2, 3), (2, 5), (4, 7), (2, 9), (4, 3)]:
            for _ in range(3):
                x = torch.randn(batch, length, 8)
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(x, 1)
                torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert counters.cudagraph_captures == 2 and counters.dynamo_traces == 1
    assert "2 FULL CUDA graphs captured, one per capture size" in caplog.text


@pytest.mark.extended
def test_an_unmodified_hugging_face_llama_gets_full_graphs(simulated_cuda):
    pytest.importorskip("transformers")
    from conftest import hf_llama

    counters = simulated_cuda
    model = hf_llama(num_hidden_layers=2)
    compiled = _dropin(model, "full", sizes=(1, 2, 4), splitting_ops=["aten::scaled_dot_product_attention"])
    with torch.no_grad():
        for shape in [(1, 7)] * 3 + [(4, 9)] * 3 + [(2, 9)] * 3:   # a static graph, then one with symbolic sizes
            ids = torch.randint(0, 128, shape)
            out = compiled(input_ids=ids, use_cache=False).last_hidden_state
            torch.testing.assert_close(out, model(input_ids=ids, use_cache=False).last_hidden_state, **FP32_TOL)
    assert counters.cudagraph_captures == 3 and counters.cudagraph_replays == 3


def test_what_the_graph_alone_shows_cannot_be_captured():
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from vgc.cudagraph.dropin import full_graph_blocker

    with FakeTensorMode():   # fake CUDA tensors need no GPU
        on_gpu, on_cpu = torch.empty(3, device="cuda"), torch.empty(3)

    def graph(*values, op=None):
        g = fx.Graph()
        nodes = []
        for i, value in enumerate(values):
            nodes.append(g.placeholder(f"x{i}"))
            nodes[-1].meta["example_value"] = value
        if op is not None:
            nodes.append(g.call_function(op, (nodes[0],)))
        g.output(tuple(nodes))
        return fx.GraphModule({}, g)

    assert full_graph_blocker(graph(on_gpu, on_gpu)) is None
    assert full_graph_blocker(graph(on_cpu, on_cpu)) is None   # a CPU model: nothing to capture anyway
    assert full_graph_blocker(graph(on_gpu, on_cpu)) == "x1 is a CPU tensor in a CUDA graph"
    assert full_graph_blocker(graph(on_gpu, op=torch.ops.vgc_test.host_sync)) == \
        "op vgc_test::host_sync is tagged cudagraph_unsafe"


def test_debug_mode_catches_a_full_graph_reading_a_stale_buffer(tiny, simulated_cuda):
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    backend = vgc.VgcBackend(vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[8], debug=True))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for seed in range(3):   # the first replay is compared with an un-graphed run, and agrees
            _check_step(cfg, model, compiled, 8, "decode", kv, seed)
        full_graphs = backend.graphs[0].full_graphs
        (entry,) = full_graphs.entries.values()
        ids = [full_graphs.inputs.names[i] for i in full_graphs.inputs.copied].index("L['input_ids']")
        entry.copy_targets[ids] = torch.zeros_like(entry.copy_targets[ids])   # refreshed, but never read
        full_graphs._debug.calls.clear()
        with pytest.raises(RuntimeError, match="differs from the un-graphed run"):
            compiled(**llama.make_batch(cfg, 8, "decode", kv_caches=kv, seed=9))


class _Counted(nn.Module):
    """Scales its input by a step counter it increments in place (as transformers' StaticCache keeps one)."""

    def forward(self, x, step):
        step.add_(1)
        return x * step


def test_a_small_written_input_that_moves_is_mirrored_not_captured_again(simulated_cuda):
    """transformers' StaticCache replaces its small counters on every generate() and keeps its K/V in place: such
    an input is copied into the graph's tensor and back around each replay, instead of a capture per call site."""
    counters = simulated_cuda
    compiled = _dropin(_Counted(), "full", sizes=(4,))
    x = torch.arange(4.0)
    with torch.no_grad():
        step = torch.zeros(1)
        for expected in (1.0, 2.0, 3.0):   # warm-up, capture, replay
            torch.testing.assert_close(compiled(x, step), x * expected)
        assert counters.cudagraph_captures == 1
        moved = torch.full((1,), 10.0)
        with counters.expect(cudagraph_captures=0, cudagraph_replays=2, eager_runs=0):
            torch.testing.assert_close(compiled(x, moved), x * 11)
            torch.testing.assert_close(compiled(x, moved), x * 12)
        assert moved.item() == 12.0                 # the caller's tensor got the write
        with counters.expect(cudagraph_captures=0, cudagraph_replays=1):
            torch.testing.assert_close(compiled(x, step), x * 4)   # back at the captured address
        assert step.item() == 4.0


def _hf_llama_and_prompt(transformers):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), torch.tensor([[5, 17, 42, 8, 99, 3]])


def test_static_cache_generate_replays_full_graphs_on_every_call(simulated_cuda):
    """transformers' own static-cache path with vgc: from the third generate() on nothing is captured (the first
    captures the decode step's FULL graph, the second the prefill's piece graphs) and every decode step replays
    the FULL graph, with eager's tokens."""
    transformers = pytest.importorskip("transformers")
    model, prompt = _hf_llama_and_prompt(transformers)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        eager = model.generate(prompt, **kwargs)
        model.forward = torch.compile(model.forward, backend="vgc", options={
            "cudagraph_mode": "full_and_piecewise", "splitting_ops": ["aten::scaled_dot_product_attention"]})
        outputs = [model.generate(prompt, **kwargs) for _ in range(2)]
        with simulated_cuda.expect(cudagraph_captures=0, dynamo_traces=0, cudagraph_replays=5):
            outputs.append(model.generate(prompt, **kwargs))
    assert all(out.tolist() == eager.tolist() for out in outputs)


def test_transformers_compile_config_with_the_vgc_backend_as_users_write_it(simulated_cuda):
    """`CompileConfig(backend="vgc")` passes torch.compile's mode "reduce-overhead", which vgc takes as CUDA
    graphs (FULL_AND_PIECEWISE); the static cache's decode step, whose SDPA reads more keys than queries, is split
    there by default. Decode steps replay the FULL graph, with eager's tokens."""
    transformers = pytest.importorskip("transformers")
    model, prompt = _hf_llama_and_prompt(transformers)
    compile_config = transformers.CompileConfig(backend="vgc")
    assert compile_config.mode == "reduce-overhead"
    compile_config._compile_all_devices = True   # transformers compiles on CUDA only unless told (test-only)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        eager = model.generate(prompt, **kwargs)
        outputs = [model.generate(prompt, **kwargs, compile_config=compile_config) for _ in range(2)]
        with simulated_cuda.expect(dynamo_traces=0, inductor_compiles=0, cudagraph_captures=0, cudagraph_replays=5):
            outputs.append(model.generate(prompt, **kwargs, compile_config=compile_config))
    assert all(out.tolist() == eager.tolist() for out in outputs)


def test_unknown_compile_mode_names_the_modes_vgc_takes(no_cache):
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="vgc", mode="fastest")
    with pytest.raises(ValueError, match=r"takes mode None or one of \['default', 'max-autotune', "
                                         r"'max-autotune-no-cudagraphs', 'reduce-overhead'\], got 'fastest'"):
        compiled(torch.randn(2, 4))

