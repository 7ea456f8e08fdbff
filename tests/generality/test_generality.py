"""Models vgc has never seen: unmodified Hugging Face transformers, split at aten SDPA, compared with eager, at three
layers (identical pieces compile once). `test_families.py` (marker `extended`) covers 20 families three ways."""

import pytest
import torch

import vgc
from conftest import FP32_TOL, hf_llama

transformers = pytest.importorskip("transformers")

SDPA_SPLIT = vgc.CompilationConfig(splitting_ops=["aten::scaled_dot_product_attention"])


def _llama():
    return hf_llama(num_hidden_layers=3)


class LastHidden(torch.nn.Module):
    """The serving entry point a user would write around a Hugging Face model."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def _phi3():
    """Phi3: its partial rotary concatenates the rotated and passed-through halves, and SDPA's CPU kernel returns
    those inputs' attention [batch, tokens, heads, dim]-major, where the trace's fake kernel said contiguous."""
    config = transformers.Phi3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                     pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.Phi3Model(config).eval()


@pytest.mark.extended
@pytest.mark.parametrize("build", [_llama, _phi3], ids=["llama", "phi3"])
def test_hf_model_dropin_split_at_sdpa(build, fresh_counters, no_cache):
    model = LastHidden(build())
    backend = vgc.VgcBackend(SDPA_SPLIT)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in ((2, 9), (3, 5)):
            ids = torch.randint(0, 128, shape)
            torch.testing.assert_close(compiled(ids), model(ids), **FP32_TOL)
    graph = backend.graphs[0]
    assert len(graph.pieces) == 2 * 3 + 1 and sum(p.is_splitting for p in graph.pieces) == 3
    assert len(graph.unique_keys) <= 3


@pytest.mark.extended
@pytest.mark.parametrize("build", [_llama], ids=["llama"])
def test_hf_model_traced_once_over_sequence_lengths(build, fresh_counters, dynamo_counters, no_cache):
    model = LastHidden(build())
    compiled = vgc.compile(model, config=SDPA_SPLIT, dynamic_arg_dims={"input_ids": 1})
    compiled.warmup(lambda n: (torch.randint(0, 128, (2, n)),))
    with fresh_counters.expect(inductor_compiles=0), torch.no_grad():
        for n in (1, 2, 5, 16, 33):
            ids = torch.randint(0, 128, (2, n))
            torch.testing.assert_close(compiled(ids), model(ids), **FP32_TOL)
    assert fresh_counters.dynamo_traces == 1
    assert dynamo_counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("graphs", [False, True], ids=["no-graphs", "piece-graphs"])
def test_a_decorated_forward_serves_calls_by_position_and_by_name(graphs, request, fresh_counters, no_cache):
    """transformers 5 decorates `LlamaModel.forward`; vgc.compile traces it through `call_forward`, whose saved
    code reads its inputs by keyword. Calls by position (and the graph dispatcher's, which passes them so) must
    reach it the same way."""
    if graphs:
        request.getfixturevalue("simulated_cuda")
    model = hf_llama(num_hidden_layers=1)
    options = {"cudagraph_mode": "piecewise", "cudagraph_capture_sizes": [2, 4]} if graphs else {}
    compiled = vgc.compile(model, options, dynamic_arg_dims={"input_ids": 0},
                           pad_values={"input_ids": 0} if graphs else None)
    make = lambda n: {"input_ids": torch.randint(1, 128, (n, 6), generator=torch.Generator().manual_seed(n))}  # noqa: E731
    compiled.warmup(make, trace_size=4)
    assert compiled.trace_source == "traced"   # captured as a saveable program, not traced live
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        for n in (2, 3, 4):
            ids = make(n)["input_ids"]
            eager = model(input_ids=ids).last_hidden_state
            torch.testing.assert_close(compiled(ids).last_hidden_state, eager, **FP32_TOL)
            torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state, eager, **FP32_TOL)
