"""EncoderCudaGraphManager on the CPU: capture and replay through the graph stand-in (`simulated_capture`),
vgc-compiled forwards from the compile cache, data-parallel sharding over gloo. tests/test_gpu.py runs real
graphs on CUDA."""

import functools
import os
import random

import pytest
import torch
import torch.multiprocessing as mp

import vgc
from vgc.cudagraph import traffic
from vgc.encoder import EncoderCompileError, EncoderCudaGraphManager, SupportsEncoderCudaGraph
from vgc.encoder.data_parallel import balance
from vgc.models import vit
from conftest import items_close

# fp32: graph replays pad with zeros and compiled pieces reorder reductions; both change rounding only.
TOL = dict(atol=1e-5, rtol=1e-5)
CFG = vit.tiny_vit_config()   # 32x32 pixels -> 4 tokens; budgets 4..256 tokens


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return vit.VisionEncoder(CFG).eval()


def eager_items(model, mm):
    with torch.no_grad():
        out = model(**mm)
    return list(torch.split(out, [s.output_tokens for s in model.get_encoder_cudagraph_item_specs(mm)]))


assert_items_close = functools.partial(items_close, **TOL)


def random_request(rng, videos=False):
    sides = [rng.choice([32, 48, 64, 96, 128, (32, 96), (64, 32)]) for _ in range(rng.randint(1, 5))]
    frames = [rng.choice([1, 1, 2, 4]) if videos else 1 for _ in sides]
    return vit.make_images(CFG, sides, frames=frames, seed=rng.randint(0, 10 ** 6))


def test_the_reference_vit_implements_the_protocol(encoder):
    assert isinstance(encoder, SupportsEncoderCudaGraph)


def test_a_model_without_the_protocol_is_refused_by_name():
    with pytest.raises(TypeError, match=r"Linear does not implement SupportsEncoderCudaGraph: it lacks "
                                        r"get_encoder_cudagraph_config, .*postprocess_encoder_output"):
        EncoderCudaGraphManager(torch.nn.Linear(2, 2))


class _PlainWrapper:
    """The protocol's methods of a model, on an object with no parameters, device or dtype of its own."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        if name in ("parameters", "buffers", "device", "dtype"):
            raise AttributeError(name)
        return getattr(self._model, name)


def test_a_model_without_parameters_must_be_told_its_device_and_dtype(encoder):
    with pytest.raises(ValueError, match="pass EncoderCudaGraphManager\\(model, device=..., dtype=...\\)"):
        EncoderCudaGraphManager(_PlainWrapper(encoder))
    manager = EncoderCudaGraphManager(_PlainWrapper(encoder), device="cpu", dtype=torch.float64)
    assert (manager.device, manager.dtype) == (torch.device("cpu"), torch.float64)
    manager = EncoderCudaGraphManager(encoder)   # a module: its parameters say
    assert (manager.device, manager.dtype) == (torch.device("cpu"), next(encoder.parameters()).dtype)


def test_execute_before_capture_is_an_error(encoder):
    manager = EncoderCudaGraphManager(encoder, compile=False)
    with pytest.raises(RuntimeError, match="call capture\\(\\) at start-up"):
        manager.execute(vit.make_images(CFG, [32]))


def test_budgets_items_and_frames_follow_the_config_and_the_model(encoder):
    auto = EncoderCudaGraphManager(encoder, compile=False).paths["default"]
    assert auto.budgets[0] == 4 and auto.budgets[-1] == CFG.max_batch_tokens
    # frames: one slot per 4-token sequence the largest budget can hold, not items x 4 frames per video
    assert auto.max_items == CFG.max_batch_tokens // 4 and auto.max_frames == CFG.max_batch_tokens // 4
    # The smallest useful budget is the caller's: it sets the first level, the items, and the slots of every
    # graph (one per 32 tokens; the largest holds all 8).
    served = EncoderCudaGraphManager(encoder, compile=False, min_budget=32).paths["default"]
    assert served.budgets[0] == 32 and served.budgets[-1] == CFG.max_batch_tokens
    assert (served.max_items, served.max_frames) == (8, 8)
    assert (served.capacity(32), served.capacity(96), served.capacity(CFG.max_batch_tokens)) == ((1, 1), (3, 3),
                                                                                                  (8, 8))
    with pytest.raises(ValueError, match="min_budget must be a positive int"):
        EncoderCudaGraphManager(encoder, compile=False, min_budget=0)
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[16, 64],
                                   encoder_cudagraph_max_vision_items_per_batch=3,
                                   encoder_cudagraph_max_frames_per_batch=5)
    chosen = EncoderCudaGraphManager(encoder, config, compile=False).paths["default"]
    assert (chosen.budgets, chosen.max_items, chosen.max_frames) == ((16, 64), 3, 5)
    assert chosen.capacity(16) == (3, 4) and chosen.capacity(64) == (3, 5)


def test_graph_replays_equal_eager_for_images_videos_and_mixed_batches(encoder, simulated_capture, fresh_counters):
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[8, 16, 32, 64, 256])
    manager = EncoderCudaGraphManager(encoder, config, compile=False)
    manager.capture()
    assert fresh_counters.cudagraph_captures == 5
    rng = random.Random(0)
    for step in range(12):   # a smaller batch after a larger one: stale buffer contents must not leak in
        mm = random_request(rng, videos=step % 3 == 2)
        assert_items_close(manager.execute(mm), eager_items(encoder, mm))
    stats = manager.stats()
    assert stats["items_missed"] == 0 and stats["hit_rate"] == 1.0 and fresh_counters.encoder_eager_runs == 0
    assert fresh_counters.encoder_replays == sum(stats["replays"]["default"].values()) > 0
    assert 0 < stats["padding_waste"] < 1


def test_items_over_every_budget_run_eagerly_and_are_counted_as_misses(encoder, simulated_capture, fresh_counters):
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[8, 16])
    manager = EncoderCudaGraphManager(encoder, config, compile=False)
    manager.capture()
    mm = vit.make_images(CFG, [32, 128, 48, 64], seed=3)   # 4, 64, 9 and 16 tokens: 128x128 is over 16
    outputs = manager.execute(mm)
    assert_items_close(outputs, eager_items(encoder, mm))
    stats = manager.stats()
    assert (stats["items_hit"], stats["items_missed"]) == (3, 1)
    assert fresh_counters.encoder_eager_runs == 1
    kept = [o.clone() for o in outputs]
    manager.execute(vit.make_images(CFG, [64, 64], seed=4))
    assert_items_close(outputs, kept)   # outputs are the caller's: the next replay does not overwrite them


def test_vgc_compiled_budgets_load_from_the_cache_and_never_compile_on_a_request(encoder, simulated_capture,
                                                                                  fresh_counters, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path))
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[8, 32, 128])
    with vgc.counters.expect(dynamo_traces=1):
        EncoderCudaGraphManager(encoder, config).capture()   # one trace serves every budget
    assert vgc.counters.inductor_compiles > 0
    torch._dynamo.reset()
    manager = EncoderCudaGraphManager(encoder, config)
    with vgc.counters.expect(inductor_compiles=0, cache_misses=0, cudagraph_captures=3) as d:
        manager.capture()   # a warm start: every artifact from the cache
    assert d["artifacts_loaded"] > 0 and manager.stats()["captured_forward"] == {"default": "compiled"}
    rng = random.Random(1)
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, cudagraph_captures=0):
        for step in range(4):
            mm = random_request(rng, videos=step == 3)
            assert_items_close(manager.execute(mm), eager_items(encoder, mm))


def test_calibration_replays_only_where_the_graph_saves_more_than_the_padding_costs(encoder, simulated_capture,
                                                                                   fresh_counters, monkeypatch):
    """Budget 8's graph saves half the time, 16's a quarter, 32's 1% (below the floor: 64 is not timed)."""
    from vgc.encoder import manager as manager_module

    timings = iter([1.0, 2.0,  0.75, 1.0,  0.99, 1.0])   # (replay, compiled forward) per timed budget
    monkeypatch.setattr(manager_module, "_median_seconds", lambda fn, device: next(timings))
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[8, 16, 32, 64])
    manager = EncoderCudaGraphManager(encoder, config, compile=False, calibrate=True)
    manager.capture()
    assert manager.stats()["graph_savings"]["default"] == pytest.approx({8: 0.5, 16: 0.25, 32: 0.01, 64: 0.0})
    cases = [([32], "replayed"),            # 4 tokens in budget 8: padding 50% <= 50% saved
             ([48], "exact"),               # 9 in 16: padding 44% > 25% saved
             ([64, 32, 32, 32], "exact"),   # 28 in 32: padding 12.5% > 1% saved
             ([64, 64, 64], "exact")]       # 48 in 64: never timed, saves nothing
    for sides, how in cases:
        before = dict(manager.stats()["path_items"]["default"])
        mm = vit.make_images(CFG, sides, seed=len(sides))
        assert_items_close(manager.execute(mm), eager_items(encoder, mm))
        after = manager.stats()["path_items"]["default"]
        assert after[how] - before[how] == len(sides), (sides, how, after)
    assert manager.stats()["items_missed"] == 0 and fresh_counters.encoder_replays == 1


def test_without_graphs_the_compiled_forward_runs_each_sub_batch_at_its_own_size(encoder, no_cache,
                                                                                 fresh_counters):
    manager = EncoderCudaGraphManager(encoder, vgc.CompilationConfig(cudagraph_mm_encoder=False))
    manager.capture()
    rng = random.Random(2)
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, encoder_replays=0):
        for step in range(3):
            mm = random_request(rng, videos=step == 2)
            assert_items_close(manager.execute(mm), eager_items(encoder, mm))
    assert manager.stats()["padding_waste"] == 0.0


def _refuse_to_compile(monkeypatch):
    import vgc.api

    def refuse(self, *args, **kwargs):
        raise RuntimeError("tracer pinned a dynamic size\nsecond line")

    monkeypatch.setattr(vgc.api.CompiledModel, "__call__", refuse)


def test_a_compile_that_fails_stops_the_capture_by_default_naming_the_path_and_the_error(encoder, simulated_capture,
                                                                                       monkeypatch):
    _refuse_to_compile(monkeypatch)
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[16, 64])
    manager = EncoderCudaGraphManager(encoder, config)
    with pytest.raises(EncoderCompileError, match=r"'default' forward \(RuntimeError: tracer pinned a dynamic "
                                                  r"size\).*on_compile_failure='model_forward'"):
        manager.capture()
    with pytest.raises(ValueError, match="on_compile_failure must be one of"):
        EncoderCudaGraphManager(encoder, config, on_compile_failure="eager")


def test_a_compile_that_fails_may_fall_back_to_capturing_the_models_own_forward(encoder, simulated_capture,
                                                                               fresh_counters, monkeypatch, caplog):
    _refuse_to_compile(monkeypatch)
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[16, 64])
    manager = EncoderCudaGraphManager(encoder, config, on_compile_failure="model_forward")
    manager.capture()   # the start goes on
    assert manager.stats()["compile_errors"] == {"default": "RuntimeError: tracer pinned a dynamic size"}
    assert manager.stats()["captured_forward"] == {"default": "model"}
    assert "could not compile the encoder's default forward (RuntimeError: tracer pinned a dynamic size)" \
        in caplog.text
    mm = vit.make_images(CFG, [32, 64, (32, 96)], seed=5)
    assert_items_close(manager.execute(mm), eager_items(encoder, mm))
    assert fresh_counters.encoder_replays == 1


def test_balance_spreads_items_by_size_and_keeps_every_index():
    # Largest first, each to the least-loaded rank: 9 | 7, 5 | then 3, 3 to rank 0 and 1 to rank 1 (15 vs 13).
    assert balance([5, 1, 9, 3, 3, 7], 2) == [[2, 3, 4], [0, 1, 5]]
    assert balance([4], 3) == [[0], [], []]


def _data_parallel_rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = vit.VisionEncoder(CFG).eval()   # same seed: the same weights on every rank
        manager = EncoderCudaGraphManager(model, vgc.CompilationConfig(cudagraph_mm_encoder=False), compile=False)
        assert manager.data_parallel
        manager.capture()
        mm = vit.make_images(CFG, [128, 32, 64, 48, (32, 96), 64, 32], frames=[1, 1, 4, 1, 1, 1, 2], seed=7)
        torch.save(manager.execute(mm), os.path.join(out_dir, f"rank{rank}.pt"))
        one = vit.make_images(CFG, [64], seed=8)   # rank 1 gets no item and still returns it
        torch.save(manager.execute(one), os.path.join(out_dir, f"rank{rank}-one.pt"))
    finally:
        dist.destroy_process_group()


def test_data_parallel_over_two_gloo_ranks_equals_one_process(encoder, tmp_path):
    mp.start_processes(_data_parallel_rank, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    mm = vit.make_images(CFG, [128, 32, 64, 48, (32, 96), 64, 32], frames=[1, 1, 4, 1, 1, 1, 2], seed=7)
    want = eager_items(encoder, mm)
    for rank in range(2):
        assert_items_close(torch.load(tmp_path / f"rank{rank}.pt"), want)
        assert_items_close(torch.load(tmp_path / f"rank{rank}-one.pt"),
                           eager_items(encoder, vit.make_images(CFG, [64], seed=8)))


def test_recorded_sub_batches_choose_the_next_managers_budgets_and_a_memory_budget_skips_graphs(
        encoder, simulated_capture, fresh_counters, tmp_path, monkeypatch):
    path = tmp_path / "encoder-traffic.json"
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True)
    manager = EncoderCudaGraphManager(encoder, config, compile=False, record=str(path))
    manager.capture()
    rng = random.Random(5)
    requests = [random_request(rng) for _ in range(10)]
    for mm in requests:
        manager.execute(mm)
    manager.recorder.flush()
    profile = traffic.load_profile(path, "encoder")
    tokens = profile.histograms["default.tokens"]
    assert sum(tokens.values()) == sum(profile.histograms["default.items"].values()) >= len(requests)
    default_memory = manager.stats()["graph_memory"]
    assert default_memory["total_bytes"] == sum(manager.stats()["graph_memory_bytes"]["default"].values()) > 0

    profiled = vgc.CompilationConfig(cudagraph_mm_encoder=True, cudagraph_traffic_profile=str(path),
                                     cudagraph_max_graphs=3)
    chosen = EncoderCudaGraphManager(encoder, profiled, compile=False)
    unit = chosen.paths["default"].unit
    expected = traffic.choose_sizes(tokens, 3, candidates=range(unit, 257, unit))
    assert list(chosen.paths["default"].budgets) == expected and len(expected) <= 3
    chosen.capture()
    for mm in requests:   # the same traffic: every sub-batch fits a chosen budget
        assert_items_close(chosen.execute(mm), eager_items(encoder, mm))
    assert chosen.stats()["items_missed"] == 0
    assert chosen.stats()["graph_memory"]["total_bytes"] < default_memory["total_bytes"]

    # a memory budget: the largest graph and about half the next one; the rest run the forward at their size
    per_budget = chosen.stats()["graph_memory"]["per_size_bytes"]
    (largest, first), (_, second) = list(per_budget.items())[:2]
    budgeted = EncoderCudaGraphManager(encoder, vgc.CompilationConfig(
        cudagraph_mm_encoder=True, cudagraph_traffic_profile=str(path), cudagraph_max_graphs=3,
        cudagraph_memory_budget_mb=(first + second / 2) / 2 ** 20), compile=False)
    budgeted.capture()
    memory = budgeted.stats()["graph_memory"]
    kept = list(memory["per_size_bytes"])
    assert kept[0] == largest and memory["total_bytes"] <= memory["budget_bytes"]
    assert memory["skipped_sizes"] and len(kept) + len(memory["skipped_sizes"]) == len(expected)
    for mm in requests:
        assert_items_close(budgeted.execute(mm), eager_items(encoder, mm))
    assert budgeted.stats()["path_items"]["default"]["exact"] > 0


def test_a_compiled_forward_is_served_under_a_profile_and_a_budget(encoder, simulated_capture, tmp_path):
    # the manager's profile and budget shape its graphs, not the compile of its forward (an encoder profile is
    # not a decoder's)
    path = tmp_path / "p.json"
    path.write_text('{"vgc_traffic_profile": 1, "kind": "encoder", "histograms": {"default.tokens": {"9": 3, '
                    '"40": 1}}}')
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, cudagraph_traffic_profile=str(path),
                                   cudagraph_memory_budget_mb=64)
    manager = EncoderCudaGraphManager(encoder, config)
    manager.capture()
    assert manager.stats()["captured_forward"] == {"default": "compiled"} and manager.stats()["captured"]["default"]
    mm = vit.make_images(CFG, [48, 96], seed=2)
    assert_items_close(manager.execute(mm), eager_items(encoder, mm))


def test_an_encoder_graph_that_runs_out_of_memory_is_skipped(encoder, simulated_capture, monkeypatch):
    from vgc import cuda_runtime

    capture = cuda_runtime.capture

    def capture_or_fail(fn, pool):
        outputs = fn()
        if outputs.shape[0] == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return capture(fn, pool)

    monkeypatch.setattr(cuda_runtime, "capture", capture_or_fail)
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[8, 16, 32])
    manager = EncoderCudaGraphManager(encoder, config, compile=False)
    manager.capture()
    stats = manager.stats()
    assert stats["captured"]["default"] == [8, 32]
    assert "out of memory" in stats["graph_memory"]["skipped_sizes"]["default:16"]
    mm = vit.make_images(CFG, [32, 48, 64], seed=9)   # 4, 9 and 16 tokens
    assert_items_close(manager.execute(mm), eager_items(encoder, mm))


def test_a_bad_encoder_profile_fails_the_managers_construction(encoder, tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"vgc_traffic_profile": 1, "kind": "decoder", "histograms": {}}')
    with pytest.raises(traffic.ProfileError, match="an encoder profile is needed"):
        EncoderCudaGraphManager(encoder, vgc.CompilationConfig(cudagraph_traffic_profile=str(path)))
