"""`vgc.integrations.transformers.breakable`: unmodified transformers causal LMs under generate(), on their default
DynamicCache, with breakable CUDA graphs (the CPU stand-in for capture: tests/simulated_graphs.py replays exactly
the operators a segment recorded, on the tensors it recorded them on, so a KV length or mask baked into a segment
gives other tokens here as on a GPU). Greedy tokens must equal eager's (SDPA) token for token, in fp32."""

import pytest
import torch
import transformers as T

from vgc.integrations import transformers as vgc_transformers

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")
FAMILIES = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, {"head_dim": 16}),
    "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM, {"head_dim": 16}),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, {}),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, {"head_dim": 16}),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM, {"pad_token_id": 0}),
    "granite": (T.GraniteConfig, T.GraniteForCausalLM, {"attention_multiplier": 0.5, "residual_multiplier": 0.5}),
    "gpt2": (T.GPT2Config, T.GPT2LMHeadModel, None),
}
GREEDY = dict(do_sample=False, pad_token_id=0)


def pair(family: str):
    """Two copies of one seeded tiny model: the reference (SDPA, untouched) and the one vgc prepares."""
    config_cls, model_cls, extra = FAMILIES[family]
    options = {**TINY, **extra} if extra is not None else dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                                                 n_positions=128, attn_implementation="sdpa")
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(model_cls(config_cls(**options)).eval())
    return models


def left_padded(batch: int, length: int, seed: int = 1):
    torch.manual_seed(seed)
    ids = torch.randint(1, 128, (batch, length))
    mask = torch.ones_like(ids)
    for row in range(1, batch):   # rows of other lengths, padded on the left as a tokenizer for generate() does
        mask[row, :row] = 0
        ids[row, :row] = 0
    return ids, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_steps_replay_and_tokens_equal_eager(family, simulated_capture, fresh_counters):
    reference, model = pair(family)
    ids, mask = left_padded(2, 6)
    want = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=7, **GREEDY)
    with fresh_counters.expect(dynamo_traces=0, inductor_compiles=0):
        vgc_transformers.breakable(model, batch_sizes=[2])
    # one prefill eagerly, then 6 decode steps, each at another KV length, all replaying one capture
    with fresh_counters.expect(cudagraph_replays=6, eager_runs=0, dynamo_traces=0, inductor_compiles=0):
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=7, **GREEDY)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    stats = model.vgc_breakable.stats()
    assert stats["breaks"] == {2: 4}   # per layer: the cache's update and the attention
    assert stats["handed_over"] == sorted([model.vgc_breakable.cache_name, "kwargs"])   # the cache, the mask
    assert stats["eager_calls"] == 1   # the prefill


def test_new_caches_masks_and_batch_sizes(simulated_capture, fresh_counters, caplog):
    """Every generate() brings a new DynamicCache, handed to the graphs per call; a call without a mask replays
    the same capture; a batch size not captured runs eagerly, right."""
    reference, model = pair("llama")
    vgc_transformers.breakable(model, batch_sizes=[1, 2])
    for batch, length, replays, masked in [(2, 5, 4, True), (1, 3, 4, False), (2, 9, 4, True), (3, 4, 0, True)]:
        ids, mask = left_padded(batch, length, seed=length)
        kwargs = dict(input_ids=ids, attention_mask=mask) if masked else dict(input_ids=ids)
        want = reference.generate(**kwargs, max_new_tokens=5, **GREEDY)
        with fresh_counters.expect(cudagraph_replays=replays, eager_runs=0):
            got = model.generate(**kwargs, max_new_tokens=5, **GREEDY)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"batch {batch}, prompt {length}")
    assert "runs eagerly" not in caplog.text   # nothing fell back from a captured size


def test_decode_steps_replay_when_mask_preparation_looks_at_the_mask(simulated_capture, fresh_counters,
                                                                     monkeypatch):
    """transformers 5.17's mask preparation reads a 2-D mask's shape before it learns the attention wants no
    prepared mask: a read of the mask inside a segment, as here. The mask is one token longer each step, so a
    capture tied to it would never replay."""
    from transformers.models.llama import modeling_llama

    prepare = modeling_llama.create_causal_mask

    def looking(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            raise AssertionError("generate() passes a 2-D mask")
        return prepare(*args, **kwargs)

    monkeypatch.setattr(modeling_llama, "create_causal_mask", looking)
    reference, model = pair("llama")
    vgc_transformers.breakable(model, batch_sizes=[2])
    ids, mask = left_padded(2, 5)
    want = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **GREEDY)
    with fresh_counters.expect(cudagraph_replays=5, eager_runs=0):
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **GREEDY)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


SLIDING = {   # a window of 4 tokens: prompts of 6 and 7 new tokens attend past it
    "mistral": (T.MistralConfig, T.MistralForCausalLM, {"sliding_window": 4}),
    "gemma3": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
               {"head_dim": 16, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}),
}


@pytest.mark.parametrize("family", SLIDING)
def test_sliding_window_models_equal_eager(family, simulated_capture, fresh_counters):
    """transformers passes each layer's sliding window to the attention, and a sliding layer's cache keeps only its
    last tokens: the op attends over the window, the padding mask's last columns matching the kept keys."""
    config_cls, model_cls, extra = SLIDING[family]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(model_cls(config_cls(**TINY, **extra)).eval())
    reference, model = models
    ids, mask = left_padded(2, 6)
    want = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, **GREEDY)
    vgc_transformers.breakable(model, batch_sizes=[2])
    with fresh_counters.expect(cudagraph_replays=7, eager_runs=0):
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, **GREEDY)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("config_cls, model_cls, extra, message", [
    (T.Gemma2Config, T.Gemma2ForCausalLM, {"head_dim": 16, "attn_implementation": "eager"},
     "soft-caps its attention logits"),
    (T.GptOssConfig, T.GptOssForCausalLM, {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                           "layer_types": ["full_attention", "full_attention"],
                                           "attn_implementation": "eager"},   # transformers' SDPA refuses sinks
     "attention sinks"),
], ids=["gemma2-softcap", "gpt-oss-sinks"])
def test_attention_the_op_does_not_compute_is_refused_at_prepare(config_cls, model_cls, extra, message):
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY, **extra})).eval()
    with pytest.raises(ValueError, match=message):
        vgc_transformers.breakable(model, batch_sizes=[1])


@pytest.mark.parametrize("options", [dict(num_beams=2, do_sample=False), dict(do_sample=True, top_k=20)],
                         ids=["beam-search", "sampling"])
def test_beam_search_and_sampling_equal_eager(options, simulated_capture, fresh_counters):
    """Beam search reorders the cache between steps (outside the forward): the reordered cache is this step's,
    handed over; 2 prompts x 2 beams replay the batch-4 capture. Sampling draws the same tokens from one seed."""
    reference, model = pair("llama")
    vgc_transformers.breakable(model, batch_sizes=[2, 4])
    ids, mask = left_padded(2, 6)
    torch.manual_seed(5)
    want = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0, **options)
    torch.manual_seed(5)
    with fresh_counters.expect(cudagraph_replays=5, eager_runs=0):
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0, **options)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_forward_calls_outside_generate_run_eagerly(simulated_capture, fresh_counters):
    reference, model = pair("llama")
    vgc_transformers.breakable(model, batch_sizes=[1])
    ids, mask = left_padded(2, 6)
    with fresh_counters.expect(cudagraph_replays=0), torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits,
                                   reference(input_ids=ids, use_cache=False).logits, rtol=2e-5, atol=2e-5)
        # a positional mask pads as a keyword one does (real tokens' logits; padding rows attend anything)
        torch.testing.assert_close(model(ids, mask).logits[mask.bool()], reference(ids, mask).logits[mask.bool()],
                                   rtol=2e-5, atol=2e-5)


def test_a_model_sharing_the_prepared_models_config_refuses_rather_than_ignore_padding():
    """The attention implementation lives on the config: a second model built from the same config object gets
    vgc's attention without vgc's router, which brings the padding mask. It raises, naming the fix."""
    config = T.LlamaConfig(**TINY)
    prepared, sharing = T.LlamaForCausalLM(config).eval(), T.LlamaForCausalLM(config).eval()
    vgc_transformers.breakable(prepared, batch_sizes=[1], warmup=False)
    ids, mask = left_padded(2, 6)
    with pytest.raises(RuntimeError, match="same config object"), torch.no_grad():
        sharing(input_ids=ids, attention_mask=mask)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_sizes": []}, "batch_sizes must be positive ints"),
    ({"batch_sizes": [0, 2]}, "batch_sizes must be positive ints"),
    ({"batch_sizes": [1], "breaks": [lambda x: x]}, "cannot be seen by the capture"),
])
def test_bad_arguments_name_the_fix(kwargs, message):
    _, model = pair("llama")
    with pytest.raises(ValueError, match=message):
        vgc_transformers.breakable(model, warmup=False, **kwargs)


def test_prepared_twice_or_training_is_refused():
    _, model = pair("llama")
    vgc_transformers.breakable(model, batch_sizes=[1], warmup=False)
    with pytest.raises(ValueError, match="already prepared"):
        vgc_transformers.breakable(model, batch_sizes=[1], warmup=False)
    _, model = pair("llama")
    with pytest.raises(ValueError, match="model.eval"):
        vgc_transformers.breakable(model.train(), batch_sizes=[1], warmup=False)


def test_warmup_captures_even_when_every_token_is_eos(simulated_capture, fresh_counters):
    """The warm-up generate() makes its three tokens whatever the model's EOS (here: every token), and leaves the
    model's generation settings as they were."""
    _, model = pair("llama")
    model.generation_config.eos_token_id = list(range(128))
    vgc_transformers.breakable(model, batch_sizes=[1, 2])
    assert model.vgc_breakable.stats()["capture_sizes"] == [1, 2]
    assert model.generation_config.eos_token_id == list(range(128))
