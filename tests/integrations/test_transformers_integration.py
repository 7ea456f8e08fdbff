"""`vgc.integrations.transformers`: unmodified Hugging Face causal LMs under generate(), on vgc's paged cache.

Every test compares with the same model run eagerly (fp32, CPU): tokens equal token for token. Each family's model
is compiled once for the module (a cold compile costs ~30 s on 2 cores) and serves every test of that family."""

import pytest
import torch

import vgc

transformers = pytest.importorskip("transformers")
from vgc.integrations import transformers as vgc_transformers  # noqa: E402

MAX_CACHE_LEN = 64

# Tiny shapes of each family (random weights), with the features that make them differ: GQA, Qwen2's q/k/v biases,
# Mistral's sliding window (wider than the cache, so it never binds), Gemma3's q/k norms, embedding scale, a
# query_pre_attn_scalar and sliding layers.
_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")
FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_COMMON)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_COMMON)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**_COMMON, sliding_window=96)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **_COMMON, head_dim=16, sliding_window=MAX_CACHE_LEN, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"])),
}

# Three left-padded prompts of 6, 4 and 2 tokens.
PROMPTS = torch.tensor([[5, 17, 42, 8, 99, 3], [0, 0, 7, 8, 9, 10], [0, 0, 0, 0, 1, 2]])
MASK = (torch.arange(6)[None] >= torch.tensor([[0], [2], [4]])).long()


def _build(family: str):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


_compiled: dict[str, tuple] = {}


@pytest.fixture(params=list(FAMILIES))
def pair(request):
    """(eager model, vgc model) of one family: the same weights, the vgc one compiled (once per session)."""
    family = request.param
    if family not in _compiled:
        eager, model = _build(family), _build(family)
        vgc_transformers.compile(model, max_batch_size=4, max_cache_len=MAX_CACHE_LEN)
        with vgc.counters.delta() as first:
            model.vgc.warmup()
        assert first["dynamo_traces"] == 1, first
        _compiled[family] = (eager, model)
    return _compiled[family]


def _generate(model, prompts=PROMPTS, mask=MASK, **kwargs):
    kwargs = {"max_new_tokens": 16, "do_sample": False, **kwargs}
    with torch.no_grad():
        return model.generate(prompts, attention_mask=mask, **kwargs)


def test_greedy_left_padded_batch_equals_eager_and_never_compiles_again(pair):
    eager, model = pair
    want = _generate(eager)
    with vgc.counters.delta() as calls:
        got = _generate(model)
        single = _generate(model, PROMPTS[:1], MASK[:1])   # another batch size: same trace, same artifacts
    assert got.tolist() == want.tolist()
    assert single.tolist() == _generate(eager, PROMPTS[:1], MASK[:1]).tolist()
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0, calls
    assert calls["eager_runs"] == 0, calls


def test_eos_mid_batch(pair):
    eager, model = pair
    # An EOS that row 0 reaches early in eager's greedy output: that row stops (then pads) while the others go on.
    free = _generate(eager, max_new_tokens=8)[:, PROMPTS.shape[1]:]
    eos = free[0, 2].item()
    want = _generate(eager, eos_token_id=eos, max_new_tokens=12)
    got = _generate(model, eos_token_id=eos, max_new_tokens=12)
    assert got.tolist() == want.tolist()
    assert (want[0, PROMPTS.shape[1] + 3:] == 0).all(), "row 0 did not stop at the EOS"


def test_sampling_with_a_seed_equals_eager(pair):
    eager, model = pair
    outputs = []
    for m in (eager, model):
        torch.manual_seed(1234)
        outputs.append(_generate(m, do_sample=True, top_k=20, temperature=0.9).tolist())
    assert outputs[0] == outputs[1]


def test_prefill_logits_of_every_real_token_equal_eager():
    eager, model = _compiled.get("llama") or (None, None)
    if model is None:
        pytest.skip("runs after the llama tests built the model")
    with torch.no_grad():
        want = eager(PROMPTS, attention_mask=MASK).logits
        cache = vgc_transformers.VgcCache(model.vgc)
        got = model(PROMPTS, attention_mask=MASK, logits_to_keep=0,
                    **{model.vgc.cache_keyword: cache}).logits
    real = MASK.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=2e-5)
    assert cache.get_seq_length() == PROMPTS.shape[1]
    assert cache.lens.tolist() == [6, 4, 2]


def test_calls_vgc_does_not_serve_run_eagerly_on_the_original_attention():
    eager, model = _compiled.get("llama") or (None, None)
    if model is None:
        pytest.skip("runs after the llama tests built the model")
    with torch.no_grad(), vgc.counters.delta() as calls:
        got = model(PROMPTS, attention_mask=MASK).logits   # a plain forward: no vgc cache
        want = eager(PROMPTS, attention_mask=MASK).logits
        dynamic = transformers.DynamicCache(config=model.config)
        tokens = _generate(model, **{model.vgc.cache_keyword: dynamic}, max_new_tokens=4)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert tokens.tolist() == _generate(eager, max_new_tokens=4).tolist()
    assert calls["eager_runs"] == 5 and calls["dynamo_traces"] == 0


def test_generate_calls_that_need_the_models_own_cache_run_eagerly():
    """What docs/transformers.md says runs eagerly does: input embeddings, per-step hidden states and attentions,
    and a cache of the caller's under either keyword transformers takes (5.25 renamed past_key_values to cache),
    each with eager's tokens and nothing dropped."""
    import warnings

    eager, model = _compiled.get("llama") or (None, None)
    if model is None:
        pytest.skip("runs after the llama tests built the model")
    embeds = eager.get_input_embeddings()(PROMPTS)
    calls = [({"inputs_embeds": embeds}, None),
             ({"output_hidden_states": True, "return_dict_in_generate": True}, "hidden_states"),
             ({"output_attentions": True, "return_dict_in_generate": True}, "attentions")]
    calls += [({name: "dynamic"}, None) for name in ("past_key_values", "cache")]
    for settings, output in calls:
        def run(m):
            kwargs = {k: transformers.DynamicCache(config=m.config) if v == "dynamic" else v
                      for k, v in settings.items()}
            with torch.no_grad():
                return m.generate(None if "inputs_embeds" in kwargs else PROMPTS, attention_mask=MASK,
                                  max_new_tokens=4, do_sample=False, **kwargs)
        with warnings.catch_warnings(record=True) as eager_said:
            warnings.simplefilter("always")
            want = run(eager)
        with vgc.counters.delta() as counted, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = run(model)
        assert counted["eager_runs"] == 4, (settings, counted)   # every forward, on the original attention
        # nothing said beyond what eager says (transformers warns when it drops one of two caches it was given)
        assert {str(w.message) for w in caught} <= {str(w.message) for w in eager_said}, settings
        if output is None:
            assert got.tolist() == want.tolist(), settings
        else:
            assert got.sequences.tolist() == want.sequences.tolist(), settings
            assert len(getattr(got, output)) == len(getattr(want, output)) == 4


def test_bad_requests_are_refused_with_the_fix():
    eager, model = _compiled.get("llama") or (None, None)
    if model is None:
        pytest.skip("runs after the llama tests built the model")
    five = torch.ones(5, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="batch of 5 sequences is more than max_batch_size=4"):
        _generate(model, five, torch.ones_like(five))
    with pytest.raises(ValueError, match=r"would reach \d+ tokens, more than max_cache_len=64"):
        _generate(model, max_new_tokens=MAX_CACHE_LEN)
    with pytest.raises(NotImplementedError, match="beam search"):
        _generate(model, num_beams=2)
    # After refused requests the model still gives eager's tokens.
    assert _generate(model, max_new_tokens=4).tolist() == _generate(eager, max_new_tokens=4).tolist()


def test_unsupported_attention_is_refused_before_anything_is_allocated():
    gemma2 = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**_COMMON, "attn_implementation": "eager"},
                                                                    head_dim=16))
    with pytest.raises(ValueError, match=r"soft-caps its attention logits \(attn_logit_softcapping=50.0\).*"
                                         r"backend='vgc'"):
        vgc_transformers.compile(gemma2)
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(**_COMMON, sliding_window=32))
    with pytest.raises(ValueError, match="sliding window of 32 tokens.*max_cache_len <= 32"):
        vgc_transformers.compile(mistral, max_cache_len=64)
    gpt_oss = transformers.GptOssForCausalLM(transformers.GptOssConfig(
        **{**_COMMON, "attn_implementation": "eager"}, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["full_attention"] * _COMMON["num_hidden_layers"]))
    with pytest.raises(ValueError, match=r"attention sinks .*backend='vgc'"):
        vgc_transformers.compile(gpt_oss)
    with pytest.raises(ValueError, match="max_batch_size must be a positive int, got 0"):
        vgc_transformers.compile(transformers.LlamaForCausalLM(transformers.LlamaConfig(**_COMMON)),
                                 max_batch_size=0)
    assert getattr(mistral, "vgc", None) is None and mistral.config._attn_implementation == "sdpa"


def test_decode_steps_replay_full_graphs_padded_to_capture_sizes(simulated_cuda):
    """The CUDA path on the CPU stand-in for capture: batch 3 decodes on the FULL graph of size 4, with eager's
    tokens; prefill (more tokens than the largest capture size) runs the compiled pieces."""
    eager, model = _build("llama"), _build("llama")
    vgc_transformers.compile(model, max_batch_size=4, max_cache_len=MAX_CACHE_LEN,
                             config={"cudagraph_mode": "full_and_piecewise", "cudagraph_capture_sizes": [1, 2, 4]})
    model.vgc.warmup()
    assert model.vgc.stats()["cudagraphs"]["full_graphs"] == 3
    with vgc.counters.delta() as calls:
        got = _generate(model)
    assert got.tolist() == _generate(eager).tolist()
    assert calls["cudagraph_replays"] == 15, calls   # every decode step after the prefill
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0 and calls["cudagraph_captures"] == 0
    # Decode steps write their inputs straight into the graph buffers, which each prefill (and each batch size)
    # overwrites with its own padding: batch sizes in turn, each against eager.
    for rows in ([0], [0, 1], [1, 2, 0], [2]):
        prompts, mask = PROMPTS[rows], MASK[rows]
        assert _generate(model, prompts, mask).tolist() == _generate(eager, prompts, mask).tolist(), rows
    assert model.vgc.stats()["cudagraphs"]["full_graphs"] == 3


def test_decode_graph_step_checks_token_ids(simulated_cuda):
    """The decode step that skips the compiled model's per-call checks still refuses an id outside the
    embedding table (IndexError, as eager), and the cache is left as it was."""
    model = _build("llama")
    vgc_transformers.compile(model, max_batch_size=2, max_cache_len=MAX_CACHE_LEN,
                             config={"cudagraph_mode": "full_and_piecewise", "cudagraph_capture_sizes": [1, 2]})
    cache = vgc_transformers.VgcCache(model.vgc)
    with torch.no_grad():
        model(PROMPTS[:1], **{model.vgc.cache_keyword: cache})
        seen, lens = cache.seen, cache.lens.clone()
        with vgc.counters.delta() as calls, pytest.raises(IndexError, match="embed_tokens"):
            model(torch.tensor([[model.config.vocab_size]]), **{model.vgc.cache_keyword: cache})
        assert calls["cudagraph_replays"] == 0 and cache.seen == seen and cache.lens.tolist() == lens.tolist()
        with vgc.counters.delta() as calls:
            model(torch.tensor([[3]]), **{model.vgc.cache_keyword: cache})
        assert calls["cudagraph_replays"] == 1, calls   # the same step, on the graph
    assert cache.seen == seen + 1 and cache.lens.tolist() == [lens.item() + 1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_generate_replays_full_graphs(dtype):
    torch.manual_seed(0)
    eager = FAMILIES["llama"]().eval().to("cuda", dtype)
    model = FAMILIES["llama"]().eval().to("cuda", dtype)
    model.load_state_dict(eager.state_dict())
    for m in (eager, model):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    vgc_transformers.compile(model, max_batch_size=4, max_cache_len=MAX_CACHE_LEN)
    prompts, mask = PROMPTS.cuda(), MASK.cuda()
    want = _generate(eager, prompts, mask)
    _generate(model, prompts, mask)
    with vgc.counters.delta() as calls:
        got = _generate(model, prompts, mask)
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0, calls
    assert calls["cudagraph_replays"] == 15, calls
    if dtype == torch.float32:
        assert got.tolist() == want.tolist()
    else:   # bf16: near-ties may flip late tokens
        assert got[:, PROMPTS.shape[1]:][:, :4].tolist() == want[:, PROMPTS.shape[1]:][:, :4].tolist()



@pytest.mark.gpu
def test_gpu_dropin_on_the_dynamic_cache_replays_piece_graphs():
    """Drop-in on transformers' default dynamic cache, split at SDPA: decode steps replay piece graphs at every
    KV length, with eager's tokens (fp32)."""
    torch.manual_seed(0)
    eager = FAMILIES["llama"]().eval().cuda()
    model = FAMILIES["llama"]().eval().cuda()
    model.load_state_dict(eager.state_dict())
    for m in (eager, model):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    model.forward = torch.compile(model.forward, backend="vgc")   # split at SDPA and PIECEWISE: the defaults here
    prompts, mask = PROMPTS.cuda(), MASK.cuda()
    want = _generate(eager, prompts, mask)
    for _ in range(2):
        _generate(model, prompts, mask)
    with vgc.counters.delta() as calls:
        got = _generate(model, prompts, mask)
    assert got.tolist() == want.tolist()
    assert calls["dynamo_traces"] == 0 and calls["cudagraph_captures"] == 0, calls
    assert calls["cudagraph_replays"] >= 15 * 3, calls   # 15 decode steps, 3 compiled pieces each


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_gpu_one_row_decode_with_the_fused_gemvs_matches_eager_logits(family, tmp_path, monkeypatch):
    """bf16 at batch 1: the decode step runs vgc's fused GEMVs (residual add, RMSNorm, product, SiLU-and-multiply,
    and q/k's rotation by transformers' full-width tables), seen in the graph dumps; each step's logits stay within
    bf16 rounding of eager's on the same tokens (weights drawn large, so a wrong rotation or position would show)."""
    monkeypatch.setenv("VGC_DEBUG_DUMP_PATH", str(tmp_path))
    monkeypatch.setenv("VGC_DISABLE_COMPILE_CACHE", "1")   # the passes run (and dump) on every compile
    torch.manual_seed(0)
    eager = FAMILIES[family]().eval()
    with torch.no_grad():
        for p in eager.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    eager = eager.to("cuda", torch.bfloat16)
    model = FAMILIES[family]().eval().to("cuda", torch.bfloat16)
    model.load_state_dict(eager.state_dict())
    for m in (eager, model):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    vgc_transformers.compile(model, max_batch_size=1, max_cache_len=MAX_CACHE_LEN,
                             config={"inductor_compile_config": {"fx_graph_cache": False}})
    out = _generate(model, PROMPTS[:1].cuda(), MASK[:1].cuda(), max_new_tokens=8, output_logits=True,
                    return_dict_in_generate=True)
    rotated = [p for p in tmp_path.glob("*after-skinny_matmul_rope.py") if "96, 16)" in p.read_text()]
    assert rotated, sorted(p.name for p in tmp_path.iterdir())
    got = torch.stack(out.logits, 1).float()
    with torch.no_grad():
        want = eager(out.sequences).logits[:, PROMPTS.shape[1] - 1:-1].float()
    torch.testing.assert_close(got, want, atol=0.05 * want.abs().max().item(), rtol=0.05)
