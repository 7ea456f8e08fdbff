"""Every transformers causal LM class through vgc's three generate() paths: eager's tokens or a clear refusal, never
other tokens (tests/family_matrix.py builds the classes and runs the requests; `python tools/family_matrix.py`
prints the table that docs/transformers.md carries).

The probe that refuses a model whose attention is not vgc's runs at prepare time with no compiler, so the quick
suite checks the refusals of the families that gave other tokens (GPT-Neo; Bloom before ALiBi) or crashed (MPT,
Falcon with ALiBi, StableLM) before it, and the families served since: ALiBi (Bloom, MPT, Falcon) on the
integration, layers that drop keyword arguments (StableLM, Falcon). The whole matrix (~190 classes, ~15 min on 2
cores) is extended."""

import copy
import inspect

import pytest
import torch
from packaging import version

transformers = pytest.importorskip("transformers")
import family_matrix  # noqa: E402  (tests/ is on sys.path)
from vgc.integrations import transformers as vgc_transformers  # noqa: E402

T = transformers


FAMILIES = {
    # the repro: other tokens than eager from the first token, every row, before the probe
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(vocab_size=256, hidden_size=64, n_layer=2, n_head=4,
                                                      pad_token_id=0)),
    # other tokens in the left-padded rows
    "gpt_neo": lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                                                          attention_types=[[["global", "local"], 1]])),
    "mpt": lambda: T.MptForCausalLM(T.MptConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4)),
    "falcon_alibi": lambda: T.FalconForCausalLM(T.FalconConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                                                               num_attention_heads=4, alibi=True)),
}
REFUSED = [
    ("gpt_neo", "compile", "none of its 2 attention layers calls"),
    ("gpt_neo", "breakable", "none of its 2 attention layers calls"),
    # ALiBi: the integration serves these (below); breakable graphs' attention has no ALiBi
    ("bloom", "breakable", "none of its 2 attention layers calls"),
    ("mpt", "breakable", "its forward fails with vgc's attention"),
    ("falcon_alibi", "breakable", "its forward fails with vgc's attention"),
]
# The transformers these families are served under (tested: 5.24, 5.25); under 5.17 Falcon (with or without ALiBi)
# is refused instead, and eager's tokens or a refusal is all that is asserted there.
SERVED = version.parse(transformers.__version__) >= version.parse("5.24")
PROMPTS = torch.tensor([[5, 17, 42, 8, 99, 3], [0, 0, 7, 8, 9, 10], [0, 0, 0, 0, 1, 2]])
REQUEST = dict(attention_mask=(PROMPTS != 0).long(), max_new_tokens=8, do_sample=False, pad_token_id=0,
               eos_token_id=None)


def _reference(family):
    torch.manual_seed(0)
    model = family_matrix.large_weights(FAMILIES[family](), seed=0)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    return model


@pytest.mark.parametrize("family,path,reason", REFUSED)
def test_a_model_whose_attention_is_not_vgcs_is_refused_and_left_as_it_was(family, path, reason):
    reference = _reference(family)
    model = copy.deepcopy(reference)
    attention = model.config._attn_implementation
    prepare = vgc_transformers.compile if path == "compile" else vgc_transformers.breakable
    with pytest.raises(ValueError, match=rf"{type(model).__name__} cannot be served by "
                                         rf"vgc.integrations.transformers.{path}: {reason}.*backend='vgc'"):
        prepare(model)
    # nothing half-prepared is left behind: the model still gives eager's tokens
    assert model.config._attn_implementation == attention
    assert getattr(model, "vgc", None) is None and getattr(model, "vgc_breakable", None) is None
    assert not any(hasattr(module, "vgc_alibi_slopes") or "forward" in vars(module) for module in model.modules())
    with torch.no_grad():
        assert torch.equal(model.generate(PROMPTS, **REQUEST), reference.generate(PROMPTS, **REQUEST))


@pytest.mark.parametrize("family", ["bloom", "mpt", "falcon_alibi"])
def test_alibi_families_give_eagers_tokens_on_the_integration(family):
    """Bloom's and MPT's attention modules compute attention themselves, Falcon's adds its ALiBi bias to the mask:
    on the integration all three attend through vgc::attention with their slopes (vgc/integrations/alibi.py).
    Greedy on a left-padded batch, an EOS mid-batch and seeded sampling, against eager, fp32 (eager pieces: the
    quick suite's budget; the extended sample below compiles Bloom's with Inductor)."""
    outcome = family_matrix.compare(_reference(family), paths=("compile",))
    assert family_matrix.ok(outcome["compile"]), outcome
    if SERVED:   # older transformers (5.17): FalconAttention computes ALiBi itself, and the probe refuses it
        assert outcome == {"compile": "equal"}, outcome


def test_a_flat_forward_dynamo_cannot_trace_is_refused_at_warmup_and_the_model_restored():
    """CTRL's attention is vgc's (the probe passes), but Dynamo cannot trace its flat forward: the first generate()
    raises the refusal, and the model is left as it was, eager's tokens after."""
    reference = family_matrix.build("ctrl", "CTRLLMHeadModel")
    model = copy.deepcopy(reference)
    attention = model.config._attn_implementation
    vgc_transformers.compile(model, max_batch_size=4, max_cache_len=32, config={"piece_backend": "eager"})
    request = dict(max_new_tokens=4, do_sample=False)
    with pytest.raises(ValueError, match=r"CTRLLMHeadModel cannot be served by vgc.integrations.transformers.compile: "
                                         r"vgc cannot trace and split its flat forward as one graph \(Unsupported"):
        family_matrix.generate(model, request)
    assert getattr(model, "vgc", None) is None and "forward" not in vars(model)
    assert model.config._attn_implementation == attention
    assert torch.equal(family_matrix.generate(model, request), family_matrix.generate(reference, request))


def test_a_generation_config_without_cache_still_gives_eagers_tokens():
    """MPT's config says use_cache=False, so generate() would re-send every column each step: the integration runs
    generate() on its cache regardless, and a call that does not continue the cache is refused, never appended."""
    reference = _reference("mpt")
    assert reference.generation_config.use_cache is False or reference.config.use_cache is False
    model = copy.deepcopy(reference)
    vgc_transformers.compile(model, max_batch_size=4, max_cache_len=64, config={"piece_backend": "eager"})
    with torch.no_grad():
        assert torch.equal(model.generate(PROMPTS, **REQUEST), reference.generate(PROMPTS, **REQUEST))
        cache = vgc_transformers.VgcCache(model.vgc)
        mask = REQUEST["attention_mask"]
        model(PROMPTS, attention_mask=mask, cache=cache) if model.vgc.cache_keyword == "cache" else \
            model(PROMPTS, attention_mask=mask, past_key_values=cache)
        with pytest.raises(RuntimeError, match="does not continue this VgcCache"):
            model.vgc.run(cache, PROMPTS, mask, 1)


def _llama():
    config = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return T.LlamaForCausalLM(config).eval()


class _OwnAttention(torch.nn.Module):
    """An attention layer of a user's own that computes its attention itself (SDPA, causal, no cache)."""

    def __init__(self, original):
        super().__init__()
        self.original = original

    def forward(self, hidden_states, **kwargs):
        attention = self.original
        batch, length, _ = hidden_states.shape
        q, k, v = (projection(hidden_states).view(batch, length, -1, attention.head_dim).transpose(1, 2)
                   for projection in (attention.q_proj, attention.k_proj, attention.v_proj))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return attention.o_proj(out.transpose(1, 2).reshape(batch, length, -1)), None


@pytest.mark.parametrize("model_type", ["stablelm", "falcon"])
def test_layers_that_drop_keyword_arguments_still_reach_vgcs_attention(model_type):
    """StableLM's and Falcon's decoder layers call their attention without the keyword arguments they were given;
    vgc's batch and mask reach the attention beside them, and the tokens are eager's."""
    name = dict(family_matrix.classes())[model_type]
    # CPU models: on a machine with CUDA, breakable graphs refuse to capture them
    paths = ("compile",) if torch.cuda.is_available() else ("compile", "breakable")
    outcome = family_matrix.run(model_type, name, paths=paths)
    assert all(family_matrix.ok(result) for result in outcome.values()), outcome
    if SERVED:   # older transformers: Falcon's forward needs a mask vgc's name does not build (refused, tested)
        assert outcome == {path: "equal" for path in paths}, outcome


@pytest.mark.parametrize("path", ["compile", "breakable"])
def test_one_layer_of_its_own_among_vgcs_is_refused(path):
    model = _llama()
    model.model.layers[1].self_attn = _OwnAttention(model.model.layers[1].self_attn)
    prepare = vgc_transformers.compile if path == "compile" else vgc_transformers.breakable
    with pytest.raises(ValueError, match="only 2 of its 3 attention layers call the function registered"):
        prepare(model)


@pytest.mark.parametrize("path", ["compile", "breakable"])
def test_a_mask_the_model_builds_itself_is_refused(path, monkeypatch):
    """A model that hands the attention function a mask or bias of its own (as ALiBi families do): vgc's attention
    would ignore it."""
    model = _llama()
    for layer in model.model.layers:
        attention, forward = layer.self_attn, layer.self_attn.forward

        def with_bias(hidden_states, attention_mask=None, _forward=forward, **kwargs):
            bias = hidden_states.new_zeros(hidden_states.shape[0], 1, hidden_states.shape[1], hidden_states.shape[1])
            return _forward(hidden_states, attention_mask=bias, **kwargs)

        monkeypatch.setattr(attention, "forward", with_bias)
    prepare = vgc_transformers.compile if path == "compile" else vgc_transformers.breakable
    with pytest.raises(ValueError, match="pass a mask or bias the model built itself"):
        prepare(model)


def test_layers_that_keep_other_state_than_keys_and_values_are_refused():
    config = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2)
    config.layer_types = ["full_attention", "mamba"]
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(config).eval()
    with pytest.raises(ValueError, match="layers of type 'mamba'"):
        vgc_transformers.compile(model)


INDUCTOR_SAMPLE = [pytest.param(*c, marks=[] if c[0] == "opt" else [pytest.mark.extended])
                   for c in family_matrix.classes() if c[0] in ("opt", "gpt2", "phi", "gpt_neox", "bloom")]


@pytest.mark.parametrize("model_type,class_name", INDUCTOR_SAMPLE)
def test_matrix_sample_with_inductor(model_type, class_name):
    """A sample of the matrix with every piece compiled by Inductor (the extended matrix runs eager pieces): learned
    absolute positions (OPT, GPT-2), partial rotary and parallel attention/MLP blocks (Phi, GPT-NeoX), ALiBi
    (Bloom: breakable graphs refuse it)."""
    outcome = family_matrix.run(model_type, class_name, piece_backend="inductor")
    assert outcome["compile"] == "equal" and outcome["dropin"] == "equal", outcome
    assert outcome["breakable"] == "equal" or model_type == "bloom" and outcome["breakable"].startswith("refused")


@pytest.mark.extended
@pytest.mark.parametrize("label,model_type,class_name,overrides", family_matrix.cases(),
                         ids=[case[0] for case in family_matrix.cases()])
def test_matrix(label, model_type, class_name, overrides):
    outcome = family_matrix.run(model_type, class_name, **overrides)
    if "skipped" in outcome:
        pytest.skip(outcome["skipped"])
    bad = {path: result for path, result in outcome.items() if not family_matrix.ok(result)}
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["bloom", "mpt", "falcon_alibi"])
def test_gpu_alibi_decode_steps_replay_full_graphs_with_eagers_tokens(family):
    """On CUDA an ALiBi decode step attends on the device (no Triton kernel, no host sync) inside the FULL graph:
    every decode step replays, fp32 tokens equal eager's (TF32 off on both sides)."""
    import vgc
    torch.backends.cuda.matmul.allow_tf32 = False
    reference = _reference(family).cuda()
    model = copy.deepcopy(reference)
    if family == "falcon_alibi" and \
            "alibi" in inspect.signature(type(model.transformer.h[0].self_attention).forward).parameters:
        # older transformers (5.17): FalconAttention takes the bias and computes attention itself; the probe refuses
        with pytest.raises(ValueError, match="none of its 2 attention layers calls"):
            vgc_transformers.compile(model, max_batch_size=4, max_cache_len=64)
        return
    vgc_transformers.compile(model, max_batch_size=4, max_cache_len=64)
    request = dict(REQUEST, attention_mask=REQUEST["attention_mask"].cuda())
    with torch.no_grad():
        want = reference.generate(PROMPTS.cuda(), **request)
        model.generate(PROMPTS.cuda(), **request)
        with vgc.counters.delta() as calls:
            got = model.generate(PROMPTS.cuda(), **request)
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0, dict(calls)
    assert calls["cudagraph_replays"] >= REQUEST["max_new_tokens"] - 1, dict(calls)
    assert got.tolist() == want.tolist()
