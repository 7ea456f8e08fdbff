"""Start-up of `vgc.integrations.transformers`: a warm process loads the saved trace of the flat forward (no Dynamo
trace, no Inductor call), and with `tiered=True` the first generate() of a cold process runs on the model itself
over vgc's paged cache while a child process compiles; a step after it ends swaps the compiled flat forward in,
mid-generate, with the KV cache kept. Tokens equal eager's throughout (fp32, large weights)."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import vgc

transformers = pytest.importorskip("transformers")
from vgc.integrations import transformers as vgc_transformers  # noqa: E402

PROMPTS = torch.tensor([[5, 17, 42, 8, 99, 3], [0, 0, 7, 8, 9, 10]])
MASK = (torch.arange(6)[None] >= torch.tensor([[0], [2]])).long()


def _build():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")).eval()
    with torch.no_grad():   # large weights: a wrong position, mask or cache entry changes the tokens
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class SwapAfter(transformers.LogitsProcessor):
    """Waits for the background compile at step `step` (a processor of the caller's: transformers' own loop)."""

    def __init__(self, model, step: int):
        self.model, self.step, self.calls = model, step, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.step:
            assert self.model.vgc.compiled.wait_for_compile(timeout=600)
        return scores


def _generate(model, **kwargs):
    with torch.no_grad():
        return model.generate(PROMPTS, attention_mask=MASK, max_new_tokens=12, do_sample=False, **kwargs).tolist()


def test_a_tiered_generate_swaps_mid_sequence_and_keeps_eagers_tokens(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    eager = _build()
    want = _generate(eager)
    model = vgc_transformers.compile(_build(), max_batch_size=2, max_cache_len=64, tiered=True)
    with caplog.at_level(logging.INFO, logger="vgc"), vgc.counters.delta() as calls:
        first = _generate(model, logits_processor=transformers.LogitsProcessorList([SwapAfter(model, 4)]))
        second = _generate(model)
    assert first == want and second == want
    assert calls["dynamo_traces"] == 0 and calls["inductor_compiles"] == 0, calls   # the child compiled
    assert calls["traces_loaded"] == 1, calls
    stats = model.vgc.stats()
    assert stats["tier"] == "compiled"
    # prefill and three decode steps on the model itself, the swap at the fourth, every later call compiled
    assert stats["tier_calls"]["eager"] == 4 and stats["tier_calls"]["compiled"] == 8 + 12, stats["tier_calls"]
    assert "swapped in the compiled model after 4 calls" in caplog.text


WARM = textwrap.dedent("""
    import json, os, torch, transformers, vgc
    from vgc.integrations import transformers as vt
    if os.environ.get("BUILD_OTHERS_FIRST"):   # other classes join transformers' registry before Llama's
        transformers.MistralForCausalLM(transformers.MistralConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1))
        transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")).eval()
    model.generation_config.pad_token_id = 0
    vt.compile(model, max_batch_size=2, max_cache_len=64)
    with torch.no_grad():
        out = model.generate(torch.tensor([[5, 17, 42, 8]]), max_new_tokens=6, do_sample=False)
    print(json.dumps({"source": model.vgc.compiled.trace_source, "tokens": out.tolist(),
                      "traces": vgc.counters.dynamo_traces, "compiles": vgc.counters.inductor_compiles}))
""")


def test_a_warm_process_loads_the_flat_forwards_saved_trace(tmp_path):
    """The guard state Dynamo saves with the flat forward must hold the model it guards (a copy of it, made for
    pickling, left it out and every warm process traced again): cold, then warm with no trace and no compile, then
    warm in a process that built other transformers models first (the trace reads the model class's record in
    transformers' registry, which Dynamo guards by position: it was refused there, as in a tiered start's server)."""
    runs = []
    for others in ("", "", "1"):
        env = {**os.environ, "VGC_CACHE_ROOT": str(tmp_path / "root"), "BUILD_OTHERS_FIRST": others}
        out = subprocess.run([sys.executable, "-c", WARM], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, *warm = runs
    assert cold["source"] == "traced" and all(run["source"] == "saved" for run in warm), runs
    assert all(run["traces"] == 0 and run["compiles"] == 0 and run["tokens"] == cold["tokens"] for run in warm), runs


@pytest.mark.extended   # a second background compile (~30 s); the suite keeps its own tiered generate()
def test_a_tiered_generate_serves_its_first_tier_on_breakable_graphs(tmp_path, monkeypatch, simulated_capture):
    """Where graphs run (CUDA, simulated here: the flat forward's inputs reported on CUDA until the swap, whose
    cache key would ask this CPU-only torch for its device), the first tier's decode steps replay breakable
    graphs of the model's own flat forward, and the tokens stay eager's across them and the swap."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    on_cuda = [True]
    monkeypatch.setattr(vgc._compat, "device_from_inputs",
                        lambda example_inputs: torch.device("cuda" if on_cuda[0] else "cpu"))
    want = _generate(_build())
    model = vgc_transformers.compile(_build(), max_batch_size=2, max_cache_len=64, tiered=True)

    class SwapOnTheCpu(SwapAfter):
        def __call__(self, input_ids, scores):
            if self.calls + 1 == self.step:
                on_cuda[0] = False
            return super().__call__(input_ids, scores)

    first = _generate(model, logits_processor=transformers.LogitsProcessorList([SwapOnTheCpu(model, 6)]))
    assert first == want and _generate(model) == want
    calls = model.vgc.stats()["tier_calls"]
    # the prefill eager, five decode steps on first-tier graphs (the first one captured), the rest compiled
    assert calls["eager"] == 1 and calls["graphs"] == 5, calls
    assert model.vgc.stats()["tier"] == "compiled"


# A fresh process: transformers' record of what each built model class can capture, after building the model
# (build) or after loading a copy of its flat forward made for another process (copy; a tiered start's child).
RECORD = textwrap.dedent("""
    import json, sys, torch, transformers
    from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    from vgc.capture import model_copy
    from vgc.integrations.paged_attention import FlatModel
    if sys.argv[1] == "build":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128))
        open(sys.argv[2], "wb").write(model_copy.dumps({"model": FlatModel(model, 64)}))
    else:
        model_copy.loads(open(sys.argv[2], "rb").read())
    print(json.dumps({key: repr(value) for key, value in dict(_CAN_RECORD_REGISTRY).items()}))
""")


def test_a_copy_for_another_process_records_its_classes_as_building_the_model_does(tmp_path):
    """transformers' forward reads a per-class record that building a model writes; a copy is made without
    `__init__`, and a trace of it without the record was refused (Dynamo's guard on it, torch 2.11) by the
    serving process of a tiered start, which never swapped (an H100, 2026-12-07). The copy writes the record."""
    records = []
    for step in ("build", "copy"):
        out = subprocess.run([sys.executable, "-c", RECORD, step, str(tmp_path / "flat.bin")], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        records.append(json.loads(out.stdout.strip().splitlines()[-1]))
    built, copied = records
    assert any("LlamaModel" in key for key in built) and any("LlamaForCausalLM" in key for key in built), built
    assert copied == built
