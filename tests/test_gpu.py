"""GPU tests (marker `gpu`; skipped without CUDA). Run on the H200 with: pytest -m gpu."""

import dataclasses
import importlib

import pytest
import torch

import vgc
from vgc.models import llama

pytestmark = pytest.mark.gpu

# bf16 keeps 8 bits of mantissa: Inductor's fused kernels round intermediates differently from eager's
# op-by-op execution, so hidden states of size O(1) differ by a few bf16 ulps after the final norm.
BF16_TOL = dict(atol=6e-2, rtol=5e-2)


@pytest.fixture(scope="module")
def tiny_bf16():
    cfg = dataclasses.replace(llama.tiny_config(), dtype=torch.bfloat16)
    return cfg, llama.Llama(cfg).cuda()


@pytest.mark.parametrize("path", ["dropin", "vgc.compile"])
def test_bf16_tiny_decoder_equals_eager_on_cuda(path, tiny_bf16, no_cache):
    cfg, model = tiny_bf16
    if path == "dropin":
        compiled = torch.compile(model, backend="vgc")
    else:
        compiled = vgc.compile(model)
        compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda"))
    with torch.no_grad():
        for kind in ("prefill", "decode"):
            for n in (1, 3, 17, 64):
                eager = model(**llama.make_batch(cfg, n, kind, device="cuda"))
                out = compiled(**llama.make_batch(cfg, n, kind, device="cuda"))
                assert out.dtype == torch.bfloat16
                torch.testing.assert_close(out, eager, **BF16_TOL, msg=f"{kind} T={n}")
                assert (out.float() - eager.float()).abs().mean() < 5e-3


# ---- CUDA graphs ----------------------------------------------------------------------------------------------

CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512]
FP32_TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def tiny_fp32():
    cfg = llama.tiny_config()
    return cfg, llama.Llama(cfg).cuda()


@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise"])
def test_cudagraph_modes_equal_eager_with_padding(mode, tiny_fp32, fresh_counters, no_cache):
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")   # graphs read fixed addresses: one cache, reused by every call
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode=mode,
                                                               cudagraph_capture_sizes=CAPTURE_SIZES),
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                           kv_caches=kv))
    graphs = report["cudagraphs"]
    expected_full = len(CAPTURE_SIZES) if mode != "piecewise" else 0
    assert graphs["full_graphs"] == expected_full
    assert graphs["piecewise_graphs"] == (0 if mode == "full" else len(CAPTURE_SIZES) * 3)
    sizes = [1, 3, 5, 8, 13, 31, 100, 257, 511, 600]   # padded to capture sizes; 600 runs without a graph
    # nothing may be captured or compiled after warm-up
    with fresh_counters.expect(cudagraph_captures=0, inductor_compiles=0), torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in sizes:
                batch = llama.make_batch(cfg, n, kind, device="cuda", kv_caches=kv)
                out = compiled(**batch).clone()
                eager_batch = llama.make_batch(cfg, n, kind, device="cuda")
                eager = model(**eager_batch)
                torch.testing.assert_close(out, eager, **FP32_TOL, msg=f"{mode} {kind} T={n}")
                # same KV writes as eager: padded tokens wrote nothing
                for cache, eager_cache in zip(kv, eager_batch["kv_caches"]):
                    torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
    assert fresh_counters.cudagraph_replays > 0
    assert fresh_counters.eager_runs >= 2   # T=600 is above every capture size
    assert fresh_counters.dynamo_traces == 1


def test_full_graph_rejects_a_moved_kv_cache(tiny_fp32, no_cache):
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[4]),
                           pad_values=llama.PAD_VALUES)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
    with pytest.raises(vgc.InputMismatchError, match="kv_caches"):
        compiled(**llama.make_batch(cfg, 3, "decode", device="cuda"))   # fresh caches: other addresses


def test_dropin_piecewise_captures_on_second_use_and_keeps_outputs(tiny_fp32, fresh_counters, no_cache):
    cfg, model = tiny_fp32
    compiled = torch.compile(model, backend="vgc", options={"cudagraph_capture_sizes": [8, 16]})
    with torch.no_grad():
        outs = []
        for seed in range(4):
            batch = llama.make_batch(cfg, 8, "decode", device="cuda", seed=seed)
            outs.append(compiled(**batch))
            eager = model(**llama.make_batch(cfg, 8, "decode", device="cuda", seed=seed))
            torch.testing.assert_close(outs[-1], eager, **FP32_TOL)
        for seed, out in enumerate(outs):   # earlier outputs were not overwritten by later replays
            torch.testing.assert_close(out, model(**llama.make_batch(cfg, 8, "decode", device="cuda", seed=seed)),
                                       **FP32_TOL)
    assert fresh_counters.cudagraph_captures == 3        # 3 compiled pieces, captured at the second call
    assert fresh_counters.cudagraph_replays == 3 * 2     # calls 3 and 4 replay


def _ops_cases():
    """The CPU tests' attention cases, from tests/ops/ (not on sys.path when this file runs alone, as on the GPU)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ops_cases", Path(__file__).parent / "ops" / "test_ops.py")
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    return cases.CASES, cases.make_case


@pytest.mark.parametrize("name", ["prefill", "decode", "mixed", "padded", "prefill_mqa"])
def test_attention_op_on_cuda_matches_reference(name):
    from vgc.ops import reference_attention

    CASES, make_case = _ops_cases()
    case = make_case(**CASES[name])
    ref_out, ref_kc, ref_vc = reference_attention(**case)
    cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    output = torch.full_like(cuda["query"], float("nan"))
    torch.ops.vgc.attention(output, **cuda)
    torch.testing.assert_close(output.cpu(), ref_out.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cuda["key_cache"].cpu(), ref_kc.float(), atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(cuda["value_cache"].cpu(), ref_vc.float(), atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_a_static_buffer_replaced_behind_the_graphs_back(mode, tiny_fp32, fresh_counters, no_cache):
    """FULL graphs read their buffers blindly: debug mode's sampled comparison must catch a stale one. Piece
    graphs re-check the addresses they read: they run without the graph, and stay correct."""
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode=mode, cudagraph_capture_sizes=[4, 8],
                                                               debug=True),
                           pad_values=llama.PAD_VALUES)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
    with torch.no_grad():
        compiled(**llama.make_batch(cfg, 6, "decode", device="cuda", kv_caches=kv))   # sampled, and correct
        static = compiled.graphs.static.buffers
        stale = static["input_ids"]   # kept alive: the allocator must not hand its address to the new buffer
        static["input_ids"] = torch.zeros_like(stale)
        batch = llama.make_batch(cfg, 3, "decode", device="cuda", kv_caches=kv, seed=1)
        if mode == "full":
            with pytest.raises(RuntimeError, match="differs from the un-graphed run"):   # other token ids
                compiled(**batch)
        else:
            with fresh_counters.delta() as d:
                out = compiled(**batch).clone()
            assert d["eager_runs"] > 0
            eager = model(**llama.make_batch(cfg, 3, "decode", device="cuda", seed=1))
            torch.testing.assert_close(out, eager, **FP32_TOL)
    del stale

# ---- drop-in FULL graphs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["full", "full_and_piecewise"])
def test_dropin_full_graphs_equal_eager_and_follow_a_moved_kv_cache(mode, tiny_fp32, fresh_counters, no_cache):
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = torch.compile(model, backend="vgc", options={"cudagraph_mode": mode,
                                                            "cudagraph_capture_sizes": [8, 16]})

    def step(n, kind, caches, seed):
        out = compiled(**llama.make_batch(cfg, n, kind, device="cuda", kv_caches=caches, seed=seed))
        eager_batch = llama.make_batch(cfg, n, kind, device="cuda", seed=seed)
        torch.testing.assert_close(out, model(**eager_batch), **FP32_TOL, msg=f"{mode} {kind} {n} {seed}")
        for cache, eager_cache in zip(caches, eager_batch["kv_caches"]):
            torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
        return out

    with torch.no_grad():
        outs = [step(8, "decode", kv, seed) for seed in range(4)]   # warm-up, capture, replays
        assert fresh_counters.cudagraph_captures == 1 and fresh_counters.cudagraph_replays == 2
        for seed, out in enumerate(outs):   # outputs survive later replays
            torch.testing.assert_close(out, model(**llama.make_batch(cfg, 8, "decode", device="cuda", seed=seed)),
                                       **FP32_TOL)
        other = llama.make_kv_caches(cfg, "cuda")
        with fresh_counters.expect(eager_runs=1, cudagraph_captures=0):   # moved: runs without the graph
            step(8, "decode", other, 5)
        with fresh_counters.expect(cudagraph_captures=1):                 # and captures again at the new address
            step(8, "decode", other, 6)
        for seed in range(3):   # 4 tokens per sequence: captured whole, attention finding sequences on the device
            step(16, "prefill", kv, seed)
        for n in (16, 16, 16, 5):   # a second symbolic size: captured; 5 is not a capture size
            step(n, "decode", kv, n)


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused-linears"])
def test_dropin_full_on_an_unmodified_hugging_face_llama(fuse, fresh_counters, no_cache):
    pytest.importorskip("transformers")
    from conftest import hf_llama

    model = hf_llama(num_hidden_layers=2).cuda()
    compiled = torch.compile(model, backend="vgc", options={
        "cudagraph_mode": "full", "splitting_ops": ["aten::scaled_dot_product_attention"],
        "pass_config": {"fuse_sibling_matmuls": fuse}})
    with torch.no_grad():
        for shape in [(1, 16)] * 3 + [(4, 32)] * 3:
            ids = torch.randint(0, 128, shape, device="cuda")
            out = compiled(input_ids=ids, use_cache=False).last_hidden_state
            torch.testing.assert_close(out, model(input_ids=ids, use_cache=False).last_hidden_state, **FP32_TOL)
    assert fresh_counters.cudagraph_captures == 2 and fresh_counters.cudagraph_replays == 2
    attention = model.layers[0].self_attn   # fused: q, k and v are rows of one weight
    assert (attention.q_proj.weight.untyped_storage().data_ptr() ==
            attention.v_proj.weight.untyped_storage().data_ptr()) == fuse


def test_vgc_compile_piece_graphs_read_the_fused_weights(fresh_counters, no_cache):
    from conftest import SiblingBlock

    model = SiblingBlock().cuda().eval()
    reference = SiblingBlock().cuda().eval()   # same seed, never fused
    compiled = vgc.compile(model, config=vgc.CompilationConfig(
        cudagraph_mode="piecewise", splitting_ops=["aten::scaled_dot_product_attention"],
        cudagraph_capture_sizes=[1, 2, 4, 8]))
    compiled.warmup(lambda n: (torch.randn(n, 16, device="cuda"),))
    assert model.q.weight.untyped_storage().data_ptr() == model.v.weight.untyped_storage().data_ptr()
    with fresh_counters.expect(cudagraph_captures=0, inductor_compiles=0) as d, torch.no_grad():
        for n in (1, 3, 8, 11):   # 1 and 8 replay graphs; 3 and 11 run the pieces (no pad_values: no padding)
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(compiled(x), reference(x), **FP32_TOL)
    assert d["cudagraph_replays"] > 0


def test_graph_memory_is_measured_and_a_budget_skips_sizes_on_a_real_pool(tiny_fp32, fresh_counters, no_cache):
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")

    def warm(**options):
        compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full_and_piecewise",
                                                                   cudagraph_capture_sizes=CAPTURE_SIZES, **options),
                               pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
        report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                                 make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                               kv_caches=kv))
        return compiled, report["cudagraphs"]

    _, graphs = warm()
    memory = graphs["graph_memory"]
    assert memory["total_bytes"] > 0 and memory["peak_bytes"] >= memory["total_bytes"]
    assert list(memory["per_size_bytes"]) == sorted(CAPTURE_SIZES, reverse=True) and not memory["skipped_sizes"]
    first = memory["per_size_bytes"][512]
    budget = first + (memory["total_bytes"] - first) / 2
    compiled, graphs = warm(cudagraph_memory_budget_mb=budget / 2 ** 20)
    kept = graphs["graph_memory"]
    assert kept["skipped_sizes"] and kept["total_bytes"] <= budget
    with fresh_counters.expect(cudagraph_captures=0, inductor_compiles=0), torch.no_grad():
        for n in (1, 3, 8, 100, 511):
            batch = llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv)
            out = compiled(**batch).clone()
            torch.testing.assert_close(out, model(**llama.make_batch(cfg, n, "decode", device="cuda")), **FP32_TOL)


def test_speculative_decoding_batches_replay_real_full_graphs(tiny_fp32, fresh_counters, no_cache):
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full_and_piecewise",
                                                               cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32],
                                                               uniform_decode_query_len=4),
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.uniform_decode_of(4))
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                           kv_caches=kv, query_len=4))
    assert report["cudagraphs"]["full_graphs"] == 4
    with fresh_counters.expect(cudagraph_captures=0, eager_runs=0) as d, torch.no_grad():
        for sequences in (1, 3, 5, 8):
            batch = llama.make_batch(cfg, 4 * sequences, "decode", device="cuda", kv_caches=kv, query_len=4)
            out = compiled(**batch).clone()
            eager = model(**llama.make_batch(cfg, 4 * sequences, "decode", device="cuda", query_len=4))
            torch.testing.assert_close(out, eager, **FP32_TOL, msg=f"{sequences} sequences")
    assert d["cudagraph_replays"] == 4


# ---- graphs without the compiler: eager pieces, breakable capture ---------------------------------------------

def test_eager_pieces_graph_modes_equal_eager(tiny_fp32, fresh_counters, no_cache):
    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = vgc.compile(model, config=vgc.CompilationConfig(piece_backend="eager", cudagraph_mode="full_and_piecewise",
                                                               cudagraph_capture_sizes=[1, 4, 16, 64]),
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                           kv_caches=kv))
    assert report["cudagraphs"]["full_graphs"] == 4 and fresh_counters.inductor_compiles == 0
    with fresh_counters.expect(cudagraph_captures=0, inductor_compiles=0) as d, torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in (1, 3, 13, 64):
                out = compiled(**llama.make_batch(cfg, n, kind, device="cuda", kv_caches=kv)).clone()
                eager = model(**llama.make_batch(cfg, n, kind, device="cuda"))
                torch.testing.assert_close(out, eager, **FP32_TOL, msg=f"{kind} T={n}")
    # decode: 4 FULL replays; prefill 1 and 3 (one token per sequence: FULL too) 2; prefill 13 and 64: 3 piece
    # graphs each
    assert d["cudagraph_replays"] == 12


@pytest.mark.parametrize("whole", [False, True], ids=["breakable", "breakable+whole-decode"])
def test_breakable_graphs_equal_eager_on_real_capture(whole, tiny_fp32, fresh_counters):
    from vgc.cudagraph import breakable

    cfg, model = tiny_fp32
    kv = llama.make_kv_caches(cfg, "cuda")
    graphs = breakable(model, dynamic_arg_dims={name: 0 for name in llama.PAD_VALUES},
                       capture_sizes=[1, 2, 4, 8, 16, 64, 256], pad_values=llama.PAD_VALUES,
                       uniform_decode=llama.is_uniform_decode if whole else None)
    with fresh_counters.expect(dynamo_traces=0, inductor_compiles=0):
        report = graphs.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda", kv_caches=kv),
                               make_decode_inputs=(lambda n: llama.make_batch(cfg, n, "decode", device="cuda",
                                                                              kv_caches=kv)) if whole else None)
    assert report["breaks"][256] == cfg.num_layers and len(report["whole_graph_sizes"]) == (7 if whole else 0)
    with fresh_counters.expect(eager_runs=1) as d, torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in (1, 3, 13, 64, 200) + ((300,) if kind == "prefill" else ()):
                out = graphs(**llama.make_batch(cfg, n, kind, device="cuda", kv_caches=kv)).clone()
                eager_batch = llama.make_batch(cfg, n, kind, device="cuda")
                torch.testing.assert_close(out, model(**eager_batch), **FP32_TOL, msg=f"{kind} T={n}")
                for cache, eager_cache in zip(kv, eager_batch["kv_caches"]):
                    torch.testing.assert_close(cache, eager_cache, **FP32_TOL)
    assert d["cudagraph_replays"] == 10


def test_breakable_refuses_a_host_read_before_the_driver_does(fresh_counters):
    from vgc.cudagraph import breakable, BreakableCaptureError

    class ItemBetweenLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            x = self.a(x)
            if x.abs().max().item() > 1e6:
                x = x / 2
            return self.b(x)

    graphs = breakable(ItemBetweenLayers().cuda().eval(), dynamic_arg_dims={"x": 0}, capture_sizes=[4])
    with pytest.raises(BreakableCaptureError, match="item"):
        graphs.warmup(lambda n: (torch.randn(n, 16, device="cuda"),))
    x = torch.randn(4, 16, device="cuda")   # the stream is usable after the refused capture
    torch.testing.assert_close(graphs(x), graphs.model(x))


@pytest.mark.parametrize("family", ["llama", "mistral-sliding-window"])
def test_breakable_generate_on_the_default_dynamic_cache(family, fresh_counters):
    """vgc.integrations.transformers.breakable: real capture of an unmodified Llama's decode step (and of a Mistral
    whose 4-token sliding window the prompt outgrows); generate()'s own DynamicCache grows at every replay; greedy
    tokens equal eager's (fp32)."""
    import transformers
    from vgc.integrations import transformers as vgc_transformers

    config_cls, model_cls, extra = (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}) if family == "llama" \
        else (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 4})
    models = []
    for _ in range(2):   # each its own config: the attention implementation is set on the config
        config = config_cls(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa", **extra)
        torch.manual_seed(0)
        models.append(model_cls(config).cuda().eval())
    reference, model = models
    vgc_transformers.breakable(model, batch_sizes=[1, 2])
    ids = torch.randint(1, 128, (2, 9), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    want = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with fresh_counters.expect(cudagraph_replays=11, eager_runs=0):
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_breakable_unmodified_hugging_face_llama(fresh_counters):
    import transformers
    from vgc.cudagraph import breakable

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).cuda().eval()
    graphs = breakable(model, dynamic_arg_dims={"input_ids": 1}, capture_sizes=[8, 16], pad_values={"input_ids": 0})
    graphs.warmup(lambda n: {"input_ids": torch.randint(128, (1, n), device="cuda"), "use_cache": False})
    with fresh_counters.expect(cudagraph_replays=3, eager_runs=0), torch.no_grad():
        for n in (5, 8, 13):
            ids = torch.randint(128, (1, n), device="cuda")
            out = graphs(input_ids=ids, use_cache=False).last_hidden_state
            torch.testing.assert_close(out, model(input_ids=ids, use_cache=False).last_hidden_state, **FP32_TOL)


@pytest.mark.parametrize("name", ["prefill", "prefill_mqa", "prefill_mha", "prefill_padded", "padded", "mixed"])
def test_attention_op_bf16_prefill_on_flash_matches_reference(name):
    """bf16 prefills of new sequences only take one flash varlen launch (grouped heads, padding rows zeroed);
    batches with cached context keep the per-sequence path. Both against the float64 reference."""
    from vgc.ops import reference_attention

    attention_module = importlib.import_module("vgc.ops.attention")   # the package's `attention` is the op

    CASES, make_case = _ops_cases()
    case = make_case(**CASES[name], head_dim=64)
    case = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in case.items()}
    ref_out, ref_kc, _ = reference_attention(**case)
    cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    output = torch.full_like(cuda["query"], float("nan"))
    calls = []
    flash = attention_module._compat.flash_varlen_forward

    def counted(*args, **kwargs):   # launches that ran: a refusal would fall back per sequence, equal too
        out = flash(*args, **kwargs)
        calls.append(args[0].shape)
        return out

    attention_module._compat.flash_varlen_forward = counted
    try:
        torch.ops.vgc.attention(output, **cuda)
    finally:
        attention_module._compat.flash_varlen_forward = flash
    fresh = all(context == 0 for context, _ in CASES[name]["specs"])
    assert len(calls) == (1 if fresh else 0) and not attention_module._flash_refused
    torch.testing.assert_close(output.cpu().float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(cuda["key_cache"].cpu(), ref_kc, atol=0, rtol=0, equal_nan=True)


def test_vgc_attention_ops_keep_sdpa_off_cudnn():
    """cuDNN's attention builds a plan per new shape (tens of ms of host time on the H200): vgc's ops switch it off
    for their own SDPA calls only, and switch it back on."""
    from vgc.ops import causal_attention  # noqa: F401  (registers the op)
    from vgc.ops.causal_attention import padding_bias

    torch.manual_seed(0)
    query = torch.randn(2, 32, 1, 64, device="cuda", dtype=torch.bfloat16)
    key, value = (torch.randn(2, 8, 37, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = torch.ones(2, 37, dtype=torch.bool, device="cuda")
    mask[1, :5] = False
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        outs = [torch.ops.vgc.causal_attention(query, key, value, given, 0.125, None)
                for given in (mask, padding_bias(mask, torch.bfloat16))]
        torch.cuda.synchronize()
    names = {event.key for event in prof.key_averages()}
    assert not any("cudnn" in name for name in names), sorted(names)
    assert torch.backends.cuda.cudnn_sdp_enabled()   # the user's setting, as it was
    torch.testing.assert_close(outs[1], outs[0], **BF16_TOL)   # the bias means what the bool mask means
