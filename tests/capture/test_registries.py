"""transformers' registry of what each built model class can record is read by key, but Dynamo guards the reads by
position: around a capture and a load vgc lays it out for the traced model alone (`vgc.capture.registries`), and
puts every record back after. The end-to-end case (a warm process that built other models first loads the saved
trace) is in tests/integrations/test_startup.py."""

import pytest
import torch

from vgc.capture.registries import laid_out_for

transformers = pytest.importorskip("transformers")
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY as REGISTRY  # noqa: E402

T = transformers


@pytest.fixture
def registry():
    saved = list(dict.items(REGISTRY))
    yield REGISTRY
    dict.clear(REGISTRY)
    dict.update(REGISTRY, saved)


def _llama():
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1))


def _mistral():
    return T.MistralForCausalLM(T.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))


def test_the_registry_holds_the_models_classes_within_and_everything_after(registry):
    _mistral()
    wrapper = torch.nn.Module()   # a wrapper of the user's around the model, as the integration's flat forward
    wrapper.model = _llama()
    before = list(dict.items(registry))
    own = [str(T.LlamaForCausalLM), str(T.LlamaModel)]
    assert [k for k, _ in before if k in own] == own and len(before) > 2
    with laid_out_for(wrapper):
        assert list(registry) == own   # the model's classes in walk order, nothing else
        assert dict.__getitem__(registry, own[1]) is dict(before)[own[1]]
        T.GPT2LMHeadModel(T.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))   # built meanwhile
    assert list(dict.items(registry))[:len(before)] == before
    assert list(registry)[len(before):] == [str(T.GPT2LMHeadModel), str(T.GPT2Model)]


def test_the_layout_depends_on_the_model_alone(registry):
    model = _llama()
    with laid_out_for(model):
        alone = list(dict.items(registry))
    _mistral()
    items = list(dict.items(registry))
    dict.clear(registry)
    dict.update(registry, reversed(items))   # other classes first, this model's in the other order
    with laid_out_for(model):
        assert list(dict.items(registry)) == alone


def test_an_error_within_puts_every_record_back(registry):
    _mistral()
    model = _llama()
    before = list(dict.items(registry))
    with pytest.raises(RuntimeError, match="inside"):
        with laid_out_for(model):
            raise RuntimeError("inside")
    assert list(dict.items(registry)) == before
    with laid_out_for(None):   # a traced function with no model: nothing laid out
        assert list(dict.items(registry)) == before
