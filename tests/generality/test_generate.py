"""transformers `generate()`: never a silent wrong answer. Drop-in vgc follows the KV cache with Dynamo's guards
and gives eager's tokens; `vgc.compile` cannot check a cache object on each call, so it refuses it up front."""

import pytest
import torch

import vgc
from conftest import hf_llama

transformers = pytest.importorskip("transformers")

PROMPT = torch.tensor([[5, 17, 42, 8, 99, 3]])
PADDED = torch.tensor([[5, 17, 42, 8, 99, 3], [0, 0, 7, 8, 9, 10], [0, 0, 0, 0, 1, 2]])
PADDED_MASK = (torch.arange(6)[None] >= torch.tensor([[0], [2], [4]])).long()
NEW_TOKENS = 5


def _generate(model, inputs=PROMPT, **kwargs):
    with torch.no_grad():
        return model.generate(inputs, **{"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0,
                                         **kwargs})


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_vgc_compile_refuses_a_kv_cache_object_instead_of_baking_it(cache, no_cache):
    model = hf_llama(2, causal_lm=True)
    model.forward = vgc.compile(model.forward)
    with vgc.counters.expect(inductor_compiles=0):
        with pytest.raises(ValueError, match=r"argument '\w+' is a transformers\.cache_utils\.\w+Cache, "
                                             r"which vgc\.compile cannot check on each call.*backend='vgc'"):
            _generate(model, cache_implementation=cache)


def test_dropin_generate_equals_eager_token_for_token(no_cache):
    """Eager's tokens at every prompt length. Dynamo traces the first generate()'s prefill with static sizes (it
    marks a size dynamic only once it has seen it change), so the first new prompt length traces once more; from
    then on no prompt length traces or compiles."""
    model = hf_llama(2, causal_lm=True)
    prompts = [torch.randint(1, 128, (1, length), generator=torch.Generator().manual_seed(length))
               for length in (6, 9, 4, 11, 7, 13, 5)]
    eager = [_generate(model, prompt) for prompt in prompts]
    model.forward = torch.compile(model.forward, backend="vgc")
    compiled = [_generate(model, prompt) for prompt in prompts[:2]]
    with vgc.counters.delta() as calls:
        compiled += [_generate(model, prompt) for prompt in prompts[2:]]
    assert [out.tolist() for out in compiled] == [out.tolist() for out in eager]
    assert compiled[0].shape[1] == prompts[0].shape[1] + NEW_TOKENS
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0, dict(calls)


def test_dropin_decode_on_the_dynamic_cache_replays_piece_graphs(simulated_cuda):
    """On transformers' default dynamic cache the KV length grows every step. The cache update and the mask, which
    follow it, run beside attention, so the compiled pieces keep one shape and their piece graphs replay on
    every decode step (CPU stand-in for capture), with eager's tokens, on the default options. Three left-padded
    rows: the padding mask and the index tensors transformers builds it from follow the KV length too."""
    model = hf_llama(2, causal_lm=True)
    kwargs = {"max_new_tokens": 8, "attention_mask": PADDED_MASK}
    eager = _generate(model, inputs=PADDED, **kwargs)
    # The default splitting ops: a graph whose SDPA reads a KV cache is split there without being asked.
    model.forward = torch.compile(model.forward, backend="vgc", options={"cudagraph_mode": "piecewise"})
    outputs = []
    for _ in range(3):
        with vgc.counters.delta() as calls:
            outputs.append(_generate(model, inputs=PADDED, **kwargs))
    assert all(out.tolist() == eager.tolist() for out in outputs)
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0 and calls["cudagraph_captures"] == 0
    # From the third generate() on (each signature captures on its second call), the 7 decode steps at 7 KV
    # lengths replay the graphs of the 3 compiled pieces (2 layers), and the prefill, whose queries are its keys,
    # is one piece and replays one graph.
    assert calls["cudagraph_replays"] == 3 * 7 + 1, dict(calls)
