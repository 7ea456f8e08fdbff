"""`piece_backend="eager"`: capture, split, saved traces and CUDA graphs as with Inductor, but every piece runs its
own graph and no Inductor call is made, cold or warm."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vgc
from vgc.cache import keys
from vgc.shells import bundle
from vgc.models import llama
from conftest import FP32_TOL, SiblingBlock

WORKER = str(Path(__file__).parents[1] / "workers" / "warm_worker.py")
EAGER = {"piece_backend": "eager"}


def run_worker(root, config: dict):
    env = dict(os.environ, VGC_CACHE_ROOT=str(root))
    # three layers: the middle pieces are alike, and a saved trace stores such a graph once
    proc = subprocess.run([sys.executable, WORKER, "--config", json.dumps(config), "--layers", "3"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vgc_compile_cold_then_warm_never_calls_inductor(tmp_path):
    """Tiny decoder (three layers) in fresh processes: the cold start traces and saves its trace with the pieces'
    graphs in it; the warm start loads that (no Dynamo) and runs them; neither calls Inductor, both equal eager."""
    cold = run_worker(tmp_path, EAGER)
    warm = run_worker(tmp_path, EAGER)
    assert cold["trace_source"] == "traced" and warm["trace_source"] == "saved"
    for report in (cold, warm):
        counts = report["counters"]
        assert counts["inductor_compiles"] == 0 and counts["artifacts_loaded"] == 0, counts
        assert report["max_diff"] <= 1e-5 and not report["warnings"], report["warnings"]
    assert cold["counters"]["dynamo_traces"] == 1 and cold["counters"]["traces_saved"] == 1
    assert warm["counters"]["dynamo_traces"] == 0 and warm["counters"]["traces_loaded"] == 1
    # a bundle of the eager entry installs on this machine (its key holds no CPU vector ISA, and the check of the
    # environment knows not to ask for one)
    bundle.pack(str(tmp_path), str(tmp_path / "eager.vgcb"))
    bundle.unpack(str(tmp_path / "eager.vgcb"), str(tmp_path / "elsewhere"))
    assert "cpu_vec_isa" not in keys.environment_factors("cpu", compiles=False)
    # another cache entry than Inductor's pieces: the backend is in the key
    entries = sorted(p.name for p in (tmp_path / "torch_compile_cache").iterdir())
    inductor = run_worker(tmp_path, {})
    assert inductor["counters"]["inductor_compiles"] > 0
    assert len(sorted(p.name for p in (tmp_path / "torch_compile_cache").iterdir())) == len(entries) + 1


def test_config_hash_and_bad_value():
    assert vgc.CompilationConfig(**EAGER).compute_hash() != vgc.CompilationConfig().compute_hash()
    assert vgc.CompilationConfig(piece_backend="EAGER").piece_backend == vgc.PieceBackend.EAGER
    with pytest.raises(ValueError, match="piece_backend must be one of 'inductor', 'eager'"):
        vgc.CompilationConfig(piece_backend="aot_eager")


def test_dropin_with_fused_siblings_equals_eager(no_cache, fresh_counters):
    """Drop-in entry point, a user's model whose sibling projections the pass fuses (on the split graph, so eager
    pieces keep it): eager's outputs, no Inductor call."""
    model = SiblingBlock().eval()
    compiled = torch.compile(model, backend="vgc", options={**EAGER, "splitting_ops": [
        "aten::scaled_dot_product_attention"]})
    with torch.no_grad():
        for n in (3, 7, 16):
            x = torch.randn(n, 16)
            torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    assert fresh_counters.inductor_compiles == 0 and fresh_counters.dynamo_traces >= 1


@pytest.mark.parametrize("mode", ["piecewise", "full_and_piecewise"])
def test_graph_modes_with_eager_pieces_equal_eager(mode, tiny, simulated_cuda):
    counters = simulated_cuda
    cfg, model = tiny
    kv = llama.make_kv_caches(cfg)
    compiled = vgc.compile(model, config=vgc.CompilationConfig(**EAGER, cudagraph_mode=mode,
                                                               cudagraph_capture_sizes=[1, 2, 4, 8]),
                           pad_values=llama.PAD_VALUES, uniform_decode=llama.is_uniform_decode)
    report = compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", kv_caches=kv),
                             make_decode_inputs=lambda n: llama.make_batch(cfg, n, "decode", kv_caches=kv))
    assert report["cudagraphs"]["piecewise_graphs"] == 3 * 4
    with counters.expect(cudagraph_captures=0, inductor_compiles=0) as d, torch.no_grad():
        for kind in ("decode", "prefill"):
            for n in (1, 3, 8):
                out = compiled(**llama.make_batch(cfg, n, kind, kv_caches=kv)).clone()
                torch.testing.assert_close(out, model(**llama.make_batch(cfg, n, kind)), **FP32_TOL)
    assert d["cudagraph_replays"] > 0 and counters.inductor_compiles == 0
