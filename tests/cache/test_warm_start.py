"""Warm starts from a saved trace: no Dynamo trace and no Inductor call, and every way a saved trace can be wrong
(an edited model, a cut-short file, another model state, a moved root) falls back to a trace with the right answer."""

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import vgc
from vgc.cache import layout, saved_traces
from vgc.shells import verify
from vgc.shells.cli import main as vgc_main
from vgc.models import llama
from conftest import FP32_TOL

WORKER = str(Path(__file__).parents[1] / "workers" / "warm_worker.py")

# A user's model in its own file, so that a test can edit its source between processes. It splits at SDPA.
MODEL_SOURCE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    SCALE = 2.0


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, x.shape[0], 3, 2, 8).unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return self.out(y.transpose(1, 2).reshape(x.shape[0], 16)) * SCALE + x


    def build():
        return Block().eval()


    def inputs(n):
        torch.manual_seed(n)
        return (torch.randn(n, 16),)
''')
SDPA_SPLIT = json.dumps({"splitting_ops": ["aten::scaled_dot_product_attention"]})


def run_worker(root, model_file=None, *args, **env_vars):
    env = dict(os.environ, VGC_CACHE_ROOT=str(root), **env_vars)
    cmd = [sys.executable, WORKER, *args] + (["--model-file", str(model_file)] if model_file else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def trace_files(root):
    return sorted(Path(root).glob(f"torch_compile_cache/*/rank_0_0/{layout.TRACE_PREFIX}*"))


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """(root, model file, cold report, warm report) for the user's SDPA model."""
    work = tmp_path_factory.mktemp("warm")
    model_file = work / "user_model.py"
    model_file.write_text(MODEL_SOURCE)
    root = work / "root"
    cold = run_worker(root, model_file)
    warm = run_worker(root, model_file)
    return root, model_file, cold, warm


def test_warm_process_makes_no_trace_and_no_inductor_call(user_model):
    _, _, cold, warm = user_model
    assert cold["trace_source"] == "traced" and cold["counters"]["traces_saved"] == 1
    assert cold["counters"]["inductor_compiles"] > 0
    assert warm["trace_source"] == "saved"
    assert warm["counters"]["dynamo_traces"] == 0 and warm["counters"]["inductor_compiles"] == 0
    assert warm["counters"]["traces_loaded"] == 1
    assert warm["counters"]["artifacts_loaded"] == cold["counters"]["artifacts_saved"]
    assert cold["max_diff"] < 1e-4 and warm["max_diff"] < 1e-4   # against eager, sizes 1, 3, 16, 21
    assert not warm["warnings"]


def test_a_warm_process_serves_without_importing_inductors_compiler(user_model, tmp_path):
    """Its artifacts load with the compiler's modules stood in for (`vgc/_compat/inductor_load.py`); the model's
    linear layers still call Inductor's `extern_kernels` (torch's addmm), answered without `select_algorithm`.
    Torch's ordinary load (`VGC_LOAD_WITHOUT_COMPILER=0`) imports them, from a copy of the same root."""
    root, model_file, cold, warm = user_model
    assert "torch._inductor.select_algorithm" in cold["compiler_modules"]
    assert warm["compiler_modules"] == [] and warm["counters"]["artifacts_loaded"] > 0
    assert warm["max_diff"] < 1e-4
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    ordinary = run_worker(copy, model_file, VGC_LOAD_WITHOUT_COMPILER="0")
    assert {"torch._inductor.select_algorithm", "torch._inductor.compile_fx"} <= set(ordinary["compiler_modules"])
    assert ordinary["counters"]["inductor_compiles"] == 0 and ordinary["max_diff"] < 1e-4


@pytest.mark.gpu
def test_a_warm_cuda_process_runs_its_triton_kernels_without_importing_inductors_compiler(tmp_path):
    """The tiny decoder on CUDA (Triton kernels, cuBLAS through `extern_kernels`): warm, nothing compiled, the
    compiler not imported, eager's outputs (fp32, sizes 1, 3, 16, 21)."""
    cold = run_worker(tmp_path / "root", None, "--device", "cuda")
    warm = run_worker(tmp_path / "root", None, "--device", "cuda")
    assert cold["counters"]["inductor_compiles"] > 0 and warm["counters"]["inductor_compiles"] == 0
    assert warm["counters"]["artifacts_loaded"] == cold["counters"]["artifacts_saved"]
    assert warm["compiler_modules"] == [], warm["compiler_modules"]
    assert cold["max_diff"] < 1e-4 and warm["max_diff"] < 1e-4


# An unmodified transformers model: transformers 5 decorates its forward (`check_model_inputs`, `can_return_tuple`).
HF_MODEL_SOURCE = textwrap.dedent('''
    import torch
    import transformers


    def build():
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          attn_implementation="sdpa")
        torch.manual_seed(0)
        return transformers.LlamaModel(config).eval()


    def inputs(n):
        return {"input_ids": torch.randint(1, 128, (n, 8), generator=torch.Generator().manual_seed(n))}
''')


def test_an_unmodified_transformers_model_loads_its_saved_trace_in_the_next_process(tmp_path):
    """Its forward is a decorator's wrapper, which torch cannot save by name: the trace goes through
    `trace_once.call_forward`, and the module the output's class comes from is recorded as an import."""
    pytest.importorskip("transformers")
    model_file = tmp_path / "hf_model.py"
    model_file.write_text(HF_MODEL_SOURCE)
    cold = run_worker(tmp_path / "root", model_file)
    warm = run_worker(tmp_path / "root", model_file)
    assert cold["trace_source"] == "traced" and cold["counters"]["traces_saved"] == 1
    assert warm["trace_source"] == "saved" and warm["counters"]["traces_loaded"] == 1
    assert warm["counters"]["dynamo_traces"] == 0 and warm["counters"]["inductor_compiles"] == 0
    assert cold["max_diff"] < 1e-4 and warm["max_diff"] < 1e-4   # against eager, batch sizes 1, 3, 16, 21
    assert not [w for w in warm["warnings"] if "trace" in w]
    assert warm["compiler_modules"] == []


def test_edited_model_source_misses_and_is_correct(user_model, tmp_path):
    root, model_file, _, _ = user_model
    copy, edited = tmp_path / "root", tmp_path / "user_model.py"
    shutil.copytree(root, copy)
    edited.write_text(MODEL_SOURCE.replace("SCALE = 2.0", "SCALE = 3.0"))   # changes no graph op's input
    result = run_worker(copy, edited)
    assert result["trace_source"] == "traced" and result["counters"]["dynamo_traces"] == 1
    assert result["max_diff"] < 1e-4   # eager runs the edited code too: 3.0, not the saved trace's 2.0
    assert len(trace_files(copy)) == 2   # the old entry keeps its trace; the new entry has its own


@pytest.mark.parametrize("damage", ["cut short", "looping symlink"])
def test_a_damaged_trace_warns_traces_again_and_is_correct(user_model, tmp_path, capsys, damage):
    """A looping symlink in the trace's place (fault campaign, seed 5107): the start found no trace by its name
    (`exists()` fails on the loop) and traced again without a word, while verify named it."""
    root, model_file, _, _ = user_model
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    (trace,) = trace_files(copy)
    if damage == "cut short":
        trace.write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
    else:
        trace.unlink()
        trace.symlink_to(trace.name)
    assert [path for path, _ in verify.verify_root(copy)] == [trace]   # verify names it
    if damage == "cut short":
        assert vgc_main(["cache", "--root", str(copy), "why-miss", "--entry", trace.parent.parent.name]) == 0
        assert "damaged" in capsys.readouterr().out
    result = run_worker(copy, model_file)
    assert result["trace_source"] == "traced" and result["counters"]["inductor_compiles"] == 0
    assert any("saved trace" in w and "unusable" in w for w in result["warnings"])
    assert result["max_diff"] < 1e-4
    assert saved_traces.problem(trace) is None   # rewritten whole by the trace
    assert verify.verify_root(copy) == []
    assert run_worker(copy, model_file)["trace_source"] == "saved"


def test_relocated_root_still_loads_the_trace(user_model, tmp_path):
    root, model_file, _, _ = user_model
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    result = run_worker(moved, model_file)
    assert result["trace_source"] == "saved"
    assert result["counters"]["dynamo_traces"] == 0 and result["counters"]["inductor_compiles"] == 0
    assert result["max_diff"] < 1e-4


def test_same_process_second_model_loads_the_trace(tmp_path, monkeypatch):
    """A second `vgc.compile` of the same model in one process loads the saved trace too; another model state
    (an attribute the trace read) is refused by the saved guards and traced."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    first = vgc.compile(llama.Llama(cfg))
    first.warmup(lambda n: llama.make_batch(cfg, n))
    assert first.trace_source == "traced"

    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, traces_loaded=1):
        second = vgc.compile(llama.Llama(cfg))
        second.warmup(lambda n: llama.make_batch(cfg, n))
    assert second.trace_source == "saved"

    other_eps = llama.Llama(cfg)
    other_eps.norm.eps = 1e-2   # baked into the graph as a constant: the saved program would be wrong
    third = vgc.compile(other_eps)
    with vgc.counters.expect(dynamo_traces=1, traces_loaded=0):
        third.warmup(lambda n: llama.make_batch(cfg, n))
    assert third.trace_source == "traced"
    wider = llama.Llama(dataclasses.replace(cfg, intermediate_size=2 * cfg.intermediate_size))
    fourth = vgc.compile(wider)
    with vgc.counters.expect(dynamo_traces=1, traces_loaded=0):   # same code and inputs, other weight shapes
        fourth.warmup(lambda n: llama.make_batch(cfg, n))
    # ... saved beside the first model's trace, not over it: each loads its own from now on
    assert len(trace_files(tmp_path / "root")) == 2
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, traces_loaded=1):
        vgc.compile(llama.Llama(wider.cfg)).warmup(lambda n: llama.make_batch(cfg, n))
    with torch.no_grad():
        for model, compiled in ((other_eps, third), (llama.Llama(cfg), second), (wider, fourth)):
            batch = llama.make_batch(cfg, 7)
            torch.testing.assert_close(compiled(**batch), model(**llama.make_batch(cfg, 7)), **FP32_TOL)


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_a_call_other_than_the_traced_kind_traces(tmp_path, monkeypatch):
    """The saved trace is found by the input contract: another dtype is another trace, never a wrong load."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    model = Affine()
    vgc.compile(model)(torch.randn(4, 8))
    as_double = vgc.compile(model.double())
    x = torch.randn(4, 8, dtype=torch.float64)
    out = as_double(x)
    assert as_double.trace_source == "traced"
    torch.testing.assert_close(out, model(x))
    assert len(trace_files(tmp_path / "root")) == 2


@pytest.mark.parametrize("mode", ["unbacked", "backed_size_oblivious"])
def test_saved_trace_in_every_dynamic_shape_mode(mode, tmp_path, monkeypatch):
    """The other two modes trace with other symbols and assumptions; the saved trace serves them the same way."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    config = {"dynamic_shapes_config": {"type": mode}, "compile_sizes": [4]}
    traced = vgc.compile(llama.Llama(cfg), config=config)
    traced.warmup(lambda n: llama.make_batch(cfg, n))
    model = llama.Llama(cfg)
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, traces_loaded=1):
        loaded = vgc.compile(model, config=config)
        loaded.warmup(lambda n: llama.make_batch(cfg, n))
        with torch.no_grad():
            for n in (1, 4, 9):   # 1: the general graph (its `s != 1` assumption is not checked); 4: static
                torch.testing.assert_close(loaded(**llama.make_batch(cfg, n)), model(**llama.make_batch(cfg, n)),
                                           **FP32_TOL)
    assert loaded.trace_source == "saved"


class Gate(torch.nn.Module):
    def __init__(self, act: torch.nn.Module, fn):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.act, self.fn = torch.nn.Linear(8, 8), act, fn

    def forward(self, x):
        return self.fn(self.act(self.lin(x)))


@pytest.mark.parametrize("other", ["module type", "function attribute", "submodule hook"])
def test_a_model_with_other_modules_or_functions_does_not_load_the_trace(other, tmp_path, monkeypatch):
    """What a trace bakes in without a tensor or value to check: a submodule's type, a function the model holds,
    a hook on a submodule. A model that differs there must trace, not run the saved program."""
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    x = torch.randn(4, 8)
    vgc.compile(Gate(torch.nn.Tanh(), torch.sigmoid))(x)
    model = {"module type": lambda: Gate(torch.nn.Sigmoid(), torch.sigmoid),
             "function attribute": lambda: Gate(torch.nn.Tanh(), torch.neg),
             "submodule hook": lambda: Gate(torch.nn.Tanh(), torch.sigmoid)}[other]()
    if other == "submodule hook":
        model.lin.register_forward_hook(lambda module, args, out: out * 3)
    compiled = vgc.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert compiled.trace_source == ("traced-live" if other == "submodule hook" else "traced")


def test_a_first_call_that_raises_leaves_the_model_usable(tmp_path, monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    cfg = llama.tiny_config()
    vgc.compile(llama.Llama(cfg)).warmup(lambda n: llama.make_batch(cfg, n))
    model = llama.Llama(cfg)
    compiled = vgc.compile(model)
    bad = llama.make_batch(cfg, 8)
    bad["input_ids"][2] = cfg.vocab_size
    with torch.no_grad(), pytest.raises(IndexError):
        compiled(**bad)   # loads the saved trace, then the token-id check refuses the call
    with torch.no_grad():
        torch.testing.assert_close(compiled(**llama.make_batch(cfg, 8)), model(**llama.make_batch(cfg, 8)),
                                   **FP32_TOL)
    assert compiled.trace_source == "saved" and len(compiled.backend.graphs) == 1


def test_why_miss_verdict_matches_the_start_after_a_deployment_moves_cache_and_code(user_model, tmp_path, capsys):
    """A deployment copies the cache and puts the model's code at another path, where the build machine's path
    does not exist. why-miss hashes the code where `--sources` says it now is, says "cannot tell" without it,
    and each verdict is what the next start does."""
    root, model_file, _, _ = user_model
    copy, deployed = tmp_path / "root", tmp_path / "deploy" / "app" / model_file.name
    shutil.copytree(root, copy)
    (trace,) = trace_files(copy)
    entry = trace.parent.parent
    manifest_file = entry / "rank_0_0" / layout.FACTORS_FILE
    manifest = json.loads(manifest_file.read_text())
    built_at = f"/nonexistent-build-machine/app/{model_file.name}"
    manifest["source_paths"] = [built_at if p == str(model_file) else p for p in manifest["source_paths"]]
    assert built_at in manifest["source_paths"]
    manifest_file.write_text(json.dumps(manifest))
    deployed.parent.mkdir(parents=True)
    deployed.write_text(model_file.read_text())
    why = ["cache", "--root", str(copy), "why-miss", "--entry", entry.name]

    assert vgc_main(why) == 2   # the old behaviour re-used the stored hash here and said "hit"
    out = capsys.readouterr().out
    assert "unknown" in out and built_at in out and "--sources" in out

    assert vgc_main(why + ["--sources", str(tmp_path / "deploy")]) == 0
    assert "would be a hit" in capsys.readouterr().out
    result = run_worker(copy, deployed)
    assert result["trace_source"] == "saved" and result["counters"]["inductor_compiles"] == 0

    deployed.write_text(MODEL_SOURCE.replace("SCALE = 2.0", "SCALE = 3.0"))
    assert vgc_main(why + ["--sources", str(tmp_path / "deploy")]) == 1
    assert f"sources.{model_file.name}" in capsys.readouterr().out
    result = run_worker(copy, deployed)
    assert result["trace_source"] == "traced" and result["counters"]["dynamo_traces"] == 1
    assert result["max_diff"] < 1e-4


def _decorate(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return wrapper


class _Decorated(torch.nn.Module):
    @_decorate
    def forward(self, x):
        return x + 1


def _scale_by(factor, helper=torch.nn.functional.relu):
    def forward(self, x):
        return helper(x) * factor
    return forward


def test_which_closures_a_saved_trace_can_serve():
    """A saved trace bakes in what a forward's closure holds. Constants and functions pickle can name are fine,
    and enter the trace's identity; a decorator's wrapper around a function only it names (transformers'
    `can_return_tuple`, `deprecate_kwarg`) is refused up front, naming the wrapper."""
    assert saved_traces.closure_problem(_scale_by(2.0)) is None
    assert saved_traces.identity(_scale_by(2.0), "c") != saved_traces.identity(_scale_by(3.0), "c")
    assert saved_traces.identity(_scale_by(2.0), "c") == saved_traces.identity(_scale_by(2.0), "c")
    problem = saved_traces.closure_problem(_Decorated.forward)
    assert problem.startswith("its forward is a decorator's wrapper (wrapper in test_warm_start.py:") and \
        "around _Decorated.forward" in problem
    captured = torch.ones(2)
    assert "a closure over 'captured', a Tensor" in saved_traces.closure_problem(lambda x: x + captured)


def test_a_saved_trace_is_bound_to_its_entry_so_two_entries_traces_swapped_are_caught(tmp_path):
    """Issue 51: two entries of one model (two configs) hold traces of one name; swapped, each passed the hash of
    its own bytes, and a start loaded the other config's plan (3 artifacts loaded instead of 9, no warning). The
    hash covers the entry and rank now: a swapped trace is damage, which a start warns about and traces again."""
    traces = []
    for entry, program in (("a" * 20, b"the program of config A"), ("b" * 20, b"the program of config B")):
        directory = tmp_path / layout.CACHE_SUBDIR / entry / "rank_0_0"
        directory.mkdir(parents=True)
        traces.append(saved_traces.save(directory, "0123456789abcdef", program))
    first, second = traces
    assert saved_traces.read(first) == b"the program of config A" and saved_traces.problem(second) is None
    held = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(held)
    for path in traces:
        with pytest.raises(saved_traces.DamagedTrace, match="moved here from another entry"):
            saved_traces.read(path)
    assert set(traces) <= {path for path, _ in verify.verify_root(tmp_path)}
    held = first.read_bytes()   # back where each was written, both load again
    first.write_bytes(second.read_bytes())
    second.write_bytes(held)
    assert saved_traces.read(first) == b"the program of config A" and verify.verify_root(tmp_path) == []
