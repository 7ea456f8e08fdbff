"""Tiered start: with no saved trace, `warmup()` returns at once and the model itself serves while a child process
traces and compiles into the cache; the call that finds it done swaps the compiled model in. Real child processes,
real Inductor; this process makes no Dynamo trace and no Inductor call."""

import logging

import pytest
import torch

import vgc
from vgc.capture import model_copy
from vgc.models import llama
from conftest import FP32_TOL


def large_llama(cfg, seed: int):
    """vgc's Llama with weights drawn N(0, 0.2): a wrong position or mask would show in its outputs and tokens."""
    model = llama.Llama(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def test_a_cold_tiered_start_serves_at_once_then_swaps_in_the_compiled_model(tmp_path, monkeypatch, caplog):
    """...without waiting for the child's shutdown after its report: here it lingers 300 s at exit (an atexit
    handler in a `sitecustomize` on its path), as a slow shutdown of compile workers or a driver would."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(   # the compile's child only, not its compile workers
        "import atexit, sys, time\n"
        "atexit.register(lambda: 'vgc-background-compile-' in ' '.join(sys.argv) and time.sleep(300))\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))   # the child's import path is this process's
    cfg = llama.tiny_config()
    model = large_llama(cfg, seed=0)
    kv = llama.make_kv_caches(cfg)
    make = lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv)   # noqa: E731

    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0):
        compiled = vgc.compile(model, config={"compile_sizes": [4]}, pad_values=llama.PAD_VALUES,
                               uniform_decode=llama.is_uniform_decode, tiered=True)
        report = compiled.warmup(make)
        assert report["tier"] == "eager" and not report["warmed_up"]
        with torch.no_grad():
            for n in (3, 8):   # the model itself: eager's outputs exactly
                assert torch.equal(compiled(**make(n)), model(**make(n)))
    assert compiled.wait_for_compile(timeout=600), "the background compile did not end"
    child = compiled._background.process
    assert child.poll() is None, "the child's report was waited for until its exit"

    with caplog.at_level(logging.INFO, logger="vgc"), \
            vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, traces_loaded=1):
        with torch.no_grad():
            out, eager = compiled(**make(5)), model(**make(5))
    assert child.poll() is not None   # ended with its work: it was only shutting down
    torch.testing.assert_close(out, eager, **FP32_TOL)
    assert "swapped in the compiled model after 2 calls" in caplog.text
    stats = compiled.stats()
    assert stats["tier"] == "compiled" and stats["tier_calls"] == {"eager": 2, "graphs": 0, "compiled": 1}
    assert stats["warmed_up"] and compiled.trace_source == "saved"
    assert stats["seconds"]["background_compile"] > 0 and stats["seconds"]["swap"] > 0
    phases = stats["background_seconds"]   # the child's own account, its start and its compile
    assert phases["import"] > 0 and phases["trace"] > 0 and phases["compile_or_load"] > 0, phases
    assert phases["import"] + phases["trace"] < stats["seconds"]["background_compile"]
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        for n in (4, 7):
            torch.testing.assert_close(compiled(**make(n)), model(**make(n)), **FP32_TOL)

    # The next tiered start finds the cache: it loads at warm-up, as any warm start, with no background process.
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, traces_loaded=1):
        again = vgc.compile(model, config={"compile_sizes": [4]}, pad_values=llama.PAD_VALUES,
                            uniform_decode=llama.is_uniform_decode, tiered=True)
        assert again.warmup(make)["tier"] == "compiled"
    with torch.no_grad():
        torch.testing.assert_close(again(**make(6)), model(**make(6)), **FP32_TOL)


def sequence_step(cfg, kv, ids: list[int], start: int) -> dict:
    """One sequence's next tokens at positions start.., its blocks 0, 1, 2, ... (slot = position)."""
    positions = torch.arange(start, start + len(ids))
    return {"input_ids": torch.tensor(ids), "positions": positions, "kv_caches": kv,
            "slot_mapping": positions.clone(), "block_table": torch.arange(cfg.max_blocks_per_seq,
                                                                           dtype=torch.int32)[None],
            "seq_lens": torch.tensor([start + len(ids)], dtype=torch.int32),
            "query_start_loc": torch.tensor([0, len(ids)], dtype=torch.int32)}


def greedy(model, run, cfg, kv, prompt: list[int], steps: int, between=None) -> list[int]:
    """Greedy tokens of one sequence (the tied embedding as its head); `between(i)` runs before decode step i."""
    with torch.no_grad():
        hidden = run(**sequence_step(cfg, kv, prompt, 0))
        tokens = []
        for i in range(steps):
            tokens.append(int((hidden[-1] @ model.embed_tokens.weight.T).argmax()))
            if between is not None:
                between(i)
            hidden = run(**sequence_step(cfg, kv, tokens[-1:], len(prompt) + i))
    return tokens


def test_the_swap_mid_sequence_keeps_the_kv_cache_and_the_tokens_eagers(tmp_path, monkeypatch):
    """The swap runs warm-up's calls again between two decode steps, and `make_inputs` here refills the very KV
    cache the live sequence uses (llama.make_batch zeroes the caches it is given): the cache is kept and
    restored, so the tokens after the swap are eager's (fp32, large weights)."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    model = large_llama(cfg, seed=1)
    prompt = [5, 17, 42, 8, 99, 3, 250, 64]
    expected = greedy(model, model, cfg, llama.make_kv_caches(cfg), prompt, 12)

    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode, tiered=True)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv))
    tokens = greedy(model, compiled, cfg, kv, prompt, 12,
                    between=lambda i: i == 5 and compiled.wait_for_compile(timeout=600))
    assert compiled.stats()["tier_calls"] == {"eager": 6, "graphs": 0, "compiled": 7}
    assert tokens == expected


def test_with_a_graph_mode_the_first_tier_serves_on_breakable_graphs_captured_on_demand(tmp_path, monkeypatch,
                                                                                       simulated_capture):
    """Where vgc.compile captures graphs, the first tier replays breakable graphs of the model's own forward (no
    compiler): the first call runs eagerly, each later padded size is captured from the call that first needs
    it, and replays after. The tokens stay eager's across the first tier and the swap (fp32, large weights;
    CUDA graphs simulated on the CPU, the background compile a real child process). The model's inputs are
    reported on CUDA until the swap: the swap's cache key would ask this CPU-only torch for its CUDA device."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    on_cuda = [True]
    monkeypatch.setattr(vgc._compat, "device_from_inputs",
                        lambda example_inputs: torch.device("cuda" if on_cuda[0] else "cpu"))
    cfg = llama.tiny_config()
    model = large_llama(cfg, seed=2)
    prompt = [7, 200, 12, 45, 9]
    expected = greedy(model, model, cfg, llama.make_kv_caches(cfg), prompt, 10)

    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config={"cudagraph_mode": "piecewise", "cudagraph_capture_sizes": [2, 4, 8]},
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode, tiered=True)
    assert compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv))["tier"] == "eager"
    graphs = compiled._first_graphs
    assert graphs is not None and next(iter(graphs.dynamic)) == "input_ids"

    def swap_at_step_6(i):
        if i == 6:
            assert compiled.wait_for_compile(timeout=600)
            on_cuda[0] = False

    tokens = greedy(model, compiled, cfg, kv, prompt, 10, between=swap_at_step_6)
    assert tokens == expected
    # the prompt (5 tokens) ran eagerly; the first decode step captured size 2 (one token, padded) and the next
    # five replayed it; the swap came at step 7
    assert sorted(graphs.graphs) == [2]
    assert compiled.stats()["tier_calls"] == {"eager": 1, "graphs": 6, "compiled": 4}
    assert compiled.tier == "compiled" and compiled._first_graphs is None


class DataDependent(torch.nn.Module):
    """Runs eagerly, but its branch on a value breaks Dynamo's full graph: the background compile fails."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y - 1


def test_a_failed_background_compile_leaves_the_model_serving(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    model = DataDependent()
    compiled = vgc.compile(model, tiered=True)
    assert compiled.warmup(lambda n: torch.randn(n, 8))["tier"] == "eager"
    assert compiled.wait_for_compile(timeout=600)
    x = torch.randn(5, 8)
    with caplog.at_level(logging.WARNING, logger="vgc"), vgc.counters.expect(dynamo_traces=0, inductor_compiles=0):
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    assert caplog.text.count("the background compile failed (exit status") == 1, caplog.text
    assert compiled.stats()["tier"] == "eager" and compiled.stats()["tier_calls"]["eager"] == 3


def test_a_killed_background_compile_leaves_the_model_serving(tmp_path, monkeypatch, caplog):
    """The child killed mid-compile (an OOM killer, an operator): one warning naming its exit, eager's outputs."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    model = llama.Llama(cfg)
    compiled = vgc.compile(model, pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode, tiered=True)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    compiled._background.process.kill()
    assert compiled.wait_for_compile(timeout=60)
    with caplog.at_level(logging.WARNING, logger="vgc"), vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), \
            torch.no_grad():
        assert torch.equal(compiled(**llama.make_batch(cfg, 5)), model(**llama.make_batch(cfg, 5)))
    assert "the background compile failed (exit status -9" in caplog.text
    assert compiled.background_compile == "failed" and compiled.tier == "eager"


@pytest.mark.parametrize("report, named", [
    (b'{"trace_source": "tra\x00\xff', "is damaged (UnicodeDecodeError"),
    (b'{"trace_source": "traced", "seconds": {"trace": 1.0', "is damaged (JSONDecodeError"),
    (b'["traced"]', "is not one vgc's child writes (a JSON list)"),
    # a well-formed report with no compile behind it (another child's, copied over): the load finds nothing
    (b'{"trace_source": "traced", "seconds": {"trace": "1"}, "entered": true}', "its trace could not be loaded here"),
])
def test_a_damaged_or_foreign_report_leaves_the_model_serving(tmp_path, monkeypatch, caplog, report, named):
    """The child's report is written whole, so only something outside can damage it or put another in its place:
    the swap names the report, this process compiles nothing, and the model itself keeps answering."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    model = llama.Llama(cfg)
    compiled = vgc.compile(model, pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode, tiered=True)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
    background = compiled._background
    background.process.kill()
    background.process.wait()
    (background.directory / "result.json").write_bytes(report)
    assert compiled.wait_for_compile(timeout=60)
    with caplog.at_level(logging.WARNING, logger="vgc"), vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), \
            torch.no_grad():
        for n in (5, 3):
            assert torch.equal(compiled(**llama.make_batch(cfg, n)), model(**llama.make_batch(cfg, n)))
    assert named in caplog.text and caplog.text.count("tiered start:") == 1, caplog.text
    assert compiled.background_compile == "failed" and compiled.tier == "eager"
    assert compiled.stats()["tier_calls"]["eager"] == 2


class WithLambda(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.act = lambda x: x * 2   # pickle cannot name it: no child process can have this model

    def forward(self, x):
        return self.act(self.lin(x))


def test_a_model_no_child_can_have_compiles_here_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    model = WithLambda()
    compiled = vgc.compile(model, config={"piece_backend": "eager"}, tiered=True)
    with caplog.at_level(logging.WARNING, logger="vgc"):
        report = compiled.warmup(lambda n: torch.randn(n, 8))
    assert "cannot be compiled in another process" in caplog.text and "compiling here" in caplog.text
    assert report["tier"] == "compiled" and report["warmed_up"] and compiled.background_compile is None
    x = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)


class Local(torch.nn.Module):
    def forward(self, x):
        return x + 1


def test_what_cannot_reach_another_process_is_refused_by_name():
    Local.__module__ = "__main__"
    try:
        with pytest.raises(model_copy.ModelCopyError, match="Local is defined in __main__"):
            model_copy.dumps(Local())
    finally:
        Local.__module__ = __name__
    holder = torch.nn.Linear(2, 2)
    holder.act = lambda x: x
    with pytest.raises(model_copy.ModelCopyError, match="cannot be written for another process"):
        model_copy.dumps(holder)
    with pytest.raises(ValueError, match="compile_ranges_max_size"):
        vgc.compile(holder, config={"compile_ranges_max_size": 32}, tiered=True)


def test_a_copy_keeps_shapes_strides_and_small_values_not_weights():
    model = torch.nn.Linear(300, 300)
    ids = torch.tensor([3, 1, 4, 1, 5])
    wide = torch.randn(600, 300).t()   # not contiguous
    copy = model_copy.loads(model_copy.dumps({"model": model, "ids": ids, "wide": wide}))
    assert isinstance(copy["model"].weight, torch.nn.Parameter) and copy["model"].weight.requires_grad
    assert copy["model"].weight.shape == model.weight.shape and not copy["model"].weight.any()   # zeros
    assert torch.equal(copy["model"].bias, model.bias)                                          # small: values
    assert torch.equal(copy["ids"], ids)
    assert copy["wide"].shape == wide.shape and copy["wide"].stride() == wide.stride()


@pytest.mark.gpu
def test_a_tiered_start_on_cuda_swaps_in_captured_graphs(tmp_path, monkeypatch):
    """On CUDA the first tier replays breakable graphs of the model's own forward, and the swap loads and captures
    FULL_AND_PIECEWISE graphs."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    model = llama.Llama(cfg).cuda()
    kv = llama.make_kv_caches(cfg, device="cuda")
    prefill = lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv)   # noqa: E731
    decode = lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv)     # noqa: E731
    compiled = vgc.compile(model, config={"cudagraph_mode": "full_and_piecewise",
                                          "cudagraph_capture_sizes": [1, 2, 4, 8]},
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode, tiered=True)
    assert compiled.warmup(prefill, make_decode_inputs=decode)["tier"] == "eager"
    cuda_fp32 = dict(atol=1e-4, rtol=1e-4)   # Inductor's CUDA kernels sum in another order (test_gpu.py's)
    with torch.no_grad():
        assert torch.equal(compiled(**decode(3)), model(**decode(3)))
        for _ in range(3):   # the first tier's breakable graphs: size 4 captured from the first, then replayed
            torch.testing.assert_close(compiled(**decode(3)), model(**decode(3)), **cuda_fp32)
    assert compiled.stats()["tier_calls"]["graphs"] == 3
    assert compiled.wait_for_compile(timeout=600)
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        torch.testing.assert_close(compiled(**decode(3)), model(**decode(3)), **cuda_fp32)
        torch.testing.assert_close(compiled(**prefill(7)), model(**prefill(7)), **cuda_fp32)
    stats = compiled.stats()
    assert stats["tier"] == "compiled" and stats["cudagraphs"] is not None
