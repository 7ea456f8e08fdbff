"""The on-disk compile cache, with real artifacts written and read by separate processes."""

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
from vgc import envs
from vgc.cache import inventory
from vgc.shells import verify
from vgc.cache.layout import ARTIFACT_DIR
from vgc.shells.cli import main as vgc_main
from conftest import FP32_TOL

WORKER = str(Path(__file__).parents[1] / "workers" / "cache_worker.py")


def run_worker(root, *, options=None, env=None, wait=True):
    environ = dict(os.environ, VGC_CACHE_ROOT=str(root), **(env or {}))
    cmd = [sys.executable, WORKER, "--options", json.dumps(options or {})]
    proc = subprocess.Popen(cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return finish(proc) if wait else proc


def finish(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def artifact_records(root):
    (entry,) = inventory.entries(root)
    (store,) = list(entry.stores())
    return store, store.read_index()


@pytest.fixture(scope="module")
def cold_then_warm(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache-root")
    cold = run_worker(root)
    warm = run_worker(root)
    return root, cold, warm


def test_second_process_loads_every_artifact_without_inductor(cold_then_warm):
    root, cold, warm = cold_then_warm
    assert cold["counters"]["inductor_compiles"] > 0
    assert cold["counters"]["cache_misses"] == cold["counters"]["inductor_compiles"]
    assert warm["counters"]["inductor_compiles"] == 0
    assert warm["counters"]["cache_hits"] == cold["counters"]["inductor_compiles"]
    assert warm["counters"]["artifacts_loaded"] == cold["counters"]["artifacts_saved"]
    # the warm process ran the saved trace: no Dynamo, no Inductor
    assert cold["counters"]["dynamo_traces"] == 1 and cold["counters"]["traces_saved"] == 1
    assert warm["counters"]["dynamo_traces"] == 0 and warm["counters"]["traces_loaded"] == 1
    assert (cold["trace_source"], warm["trace_source"]) == ("traced", "saved")
    assert cold["max_diff"] < 1e-4 and warm["max_diff"] < 1e-4
    assert warm["cache_dirs"] == cold["cache_dirs"]


def test_entry_layout_and_debug_files(cold_then_warm):
    root, cold, _ = cold_then_warm
    (cache_dir,) = cold["cache_dirs"]
    cache_dir = Path(cache_dir)
    assert cache_dir.parent.parent == root / "torch_compile_cache"
    assert cache_dir.name == "rank_0_0"
    assert (cache_dir.parent.stat().st_mode & 0o077) == 0, "cache dirs must be private to the user"
    factors = json.loads((cache_dir / "cache_key_factors.json").read_text())
    assert factors["hash"] == cache_dir.parent.name
    assert {"config", "environment", "sources"} <= set(factors["factors"])
    assert "llama.py" in [name for name, _ in factors["factors"]["sources"]]
    # no absolute path in the key factors (paths live beside them, for why-miss only)
    assert str(root) not in json.dumps(factors["factors"]) and "/" not in json.dumps(factors["factors"]["sources"])
    graph = (cache_dir / "computation_graph.py").read_text()
    assert "vgc::attention" in graph or "torch.ops.vgc.attention" in graph
    compile(graph.split("\n\n", 1)[1].replace("torch.nn.Module", "object"), "computation_graph.py", "exec")
    assert "transformed" in (cache_dir / "transformed_code.py").read_text().lower()
    index = json.loads((cache_dir / "index.json").read_text())
    assert len(index) == cold["counters"]["artifacts_saved"]
    assert all(len(r["sha256"]) == 64 for r in index.values())


def test_copied_root_hits_every_artifact(cold_then_warm, tmp_path):
    root, cold, _ = cold_then_warm
    copy = tmp_path / "elsewhere"
    shutil.copytree(root, copy)
    result = run_worker(copy)
    assert result["counters"]["inductor_compiles"] == 0
    assert result["counters"]["cache_hits"] == cold["counters"]["artifacts_saved"]
    assert result["cache_dirs"][0].startswith(str(copy))
    assert result["max_diff"] < 1e-4


def test_corrupt_truncated_and_missing_artifacts_are_rebuilt(cold_then_warm, tmp_path):
    root, cold, _ = cold_then_warm
    copy = tmp_path / "damaged"
    shutil.copytree(root, copy)
    store, index = artifact_records(copy)
    damaged = 0
    for i, record in enumerate(sorted(index.values(), key=lambda r: r["file"])):
        path = store.directory / ARTIFACT_DIR / record["file"]
        data = path.read_bytes()
        if i % 3 == 0:
            path.write_bytes(data[: len(data) // 2])                       # truncated
        elif i % 3 == 1:
            path.write_bytes(data[:100] + b"\x00" * (len(data) - 100))     # overwritten, same size
        else:
            path.unlink()                                                  # missing
        damaged += 1
    result = run_worker(copy)
    assert result["counters"]["cache_corrupt"] == damaged
    assert result["counters"]["inductor_compiles"] == damaged
    assert len(result["unusable_warnings"]) == damaged
    assert all(str(copy) in w for w in result["unusable_warnings"]), "the warning names the artifact's path"
    assert result["max_diff"] < 1e-4
    assert verify.verify_entry(inventory.entries(copy)[0]) == []


def test_disable_cache_leaves_root_empty(tmp_path):
    root = tmp_path / "root"
    result = run_worker(root, env={"VLLM_DISABLE_COMPILE_CACHE": "1"})
    assert not root.exists() or not any(root.iterdir())
    assert result["cache_dirs"] == []
    assert result["counters"]["inductor_compiles"] > 0
    assert result["max_diff"] < 1e-4


def test_unpacked_format_keeps_readable_kernels_and_loads(tmp_path):
    root = tmp_path / "root"
    cold = run_worker(root, env={"VLLM_COMPILE_CACHE_SAVE_FORMAT": "unpacked"})
    store, index = artifact_records(root)
    assert index and all(r["format"] == "unpacked" for r in index.values())
    for record in index.values():
        artifact = store.directory / ARTIFACT_DIR / record["file"]
        assert artifact.is_dir()
        sources = [p for p in artifact.rglob("*.py")]
        assert sources, f"no generated Python in {artifact}"
        assert any("def call(" in p.read_text() or "kernel" in p.read_text() for p in sources)
    warm = run_worker(root, env={"VGC_COMPILE_CACHE_SAVE_FORMAT": "unpacked"})
    assert warm["counters"]["inductor_compiles"] == 0
    assert warm["counters"]["artifacts_loaded"] == cold["counters"]["artifacts_saved"]
    assert warm["max_diff"] < 1e-4
    assert warm["compiler_modules"] == []   # loaded without Inductor's compiler, as the binary format is


def test_four_processes_on_an_empty_root(tmp_path, capsys):
    root = tmp_path / "root"
    procs = [run_worker(root, wait=False) for _ in range(4)]
    results = [finish(p) for p in procs]
    assert all(r["max_diff"] < 1e-4 for r in results)
    saved = sum(r["counters"]["artifacts_saved"] for r in results)
    compiled = sum(r["counters"]["inductor_compiles"] for r in results)
    # the per-artifact lock makes late processes wait and load: each artifact is compiled exactly once
    assert compiled == saved == len(artifact_records(root)[1])
    assert vgc_main(["cache", "--root", str(root), "verify"]) == 0
    assert "0 bad" in capsys.readouterr().out


def test_cache_commands(cold_then_warm, tmp_path, capsys):
    root, cold, _ = cold_then_warm
    (entry,) = inventory.entries(root)
    assert vgc_main(["cache", "--root", str(root), "ls"]) == 0
    out = capsys.readouterr().out
    assert entry.hash in out and "llama.py" in out and torch.__version__ in out
    assert vgc_main(["cache", "--root", str(root), "show", entry.hash[:8]]) == 0
    out = capsys.readouterr().out
    assert "submod_0" in out and "dynamic" in out and "torch_version" in out
    assert vgc_main(["cache", "--root", str(root), "verify"]) == 0
    assert vgc_main(["cache", "--root", str(root), "show", "nosuchhash"]) == 2
    assert "no entry" in capsys.readouterr().out
    # why-miss: identical config -> hit; a codegen field changed -> that field is named
    assert vgc_main(["cache", "--root", str(root), "why-miss"]) == 0
    assert "would be a hit" in capsys.readouterr().out
    assert vgc_main(["cache", "--root", str(root), "why-miss", "--options", '{"compile_sizes": [4]}']) == 1
    out = capsys.readouterr().out
    assert "config.compile_sizes" in out and "[4]" in out
    # prune: keeps a fresh entry under a generous cap, removes it when asked
    copy = tmp_path / "prunable"
    shutil.copytree(root, copy)
    assert vgc_main(["cache", "--root", str(copy), "prune", "--max-size", "1G"]) == 0
    assert len(inventory.entries(copy)) == 1
    assert vgc_main(["cache", "--root", str(copy), "prune", "--max-size", "1K"]) == 0
    assert inventory.entries(copy) == []


MODEL_SOURCE = textwrap.dedent("""
    import torch
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            return torch.relu(self.lin(x)) * 2
""")


def _load_module(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cache_dir_for(module, config=None) -> str:
    torch.manual_seed(0)
    model = module.Model()
    compiled = vgc.compile(model, config=config or vgc.CompilationConfig())
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x), **FP32_TOL)
    (cache_dir,) = compiled.stats()["cache_dirs"]
    return cache_dir


def test_traced_source_edit_and_codegen_fields_change_the_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    original = tmp_path / "user_model.py"
    original.write_text(MODEL_SOURCE)
    base = _cache_dir_for(_load_module(original, "user_model_a"))
    assert base == _cache_dir_for(_load_module(original, "user_model_b")), "same source, same key"
    edited = tmp_path / "copy" / "user_model.py"
    edited.parent.mkdir()
    edited.write_text(MODEL_SOURCE.replace("* 2", "* 3"))
    assert _cache_dir_for(_load_module(edited, "user_model_c")) != base
    # a field that changes generated code changes the key; where the cache lives does not
    module = _load_module(original, "user_model_d")
    assert _cache_dir_for(module, vgc.CompilationConfig(compile_sizes=[4])) != base
    other_root = tmp_path / "other-root"
    moved = _cache_dir_for(module, vgc.CompilationConfig(cache_dir=str(other_root)))
    assert Path(moved).parent.name == Path(base).parent.name and moved.startswith(str(other_root))


def test_config_hash_covers_codegen_fields_only():
    base = vgc.CompilationConfig().compute_hash()
    assert vgc.CompilationConfig(cache_dir="/somewhere").compute_hash() == base
    assert vgc.CompilationConfig(compile_cache_save_format="unpacked").compute_hash() == base
    assert vgc.CompilationConfig(compile_sizes=[8]).compute_hash() != base
    assert vgc.CompilationConfig(splitting_ops=[]).compute_hash() != base
    assert vgc.CompilationConfig(inductor_compile_config={"max_autotune": True}).compute_hash() != base
    assert vgc.CompilationConfig(compile_sizes_inductor_config={"max_autotune": True}).compute_hash() != base
    assert vgc.CompilationConfig(dynamic_shapes_config="unbacked").compute_hash() != base


def test_env_aliases_and_bad_values(monkeypatch):
    monkeypatch.setenv("VLLM_COMPILE_CACHE_SAVE_FORMAT", "unpacked")
    assert envs.compile_cache_save_format() == "unpacked"
    monkeypatch.setenv("VGC_COMPILE_CACHE_SAVE_FORMAT", "binary")
    assert envs.compile_cache_save_format() == "binary", "the VGC_ name wins"
    monkeypatch.setenv("VGC_COMPILE_CACHE_SAVE_FORMAT", "zip")
    with pytest.raises(ValueError, match="VGC_COMPILE_CACHE_SAVE_FORMAT"):
        envs.compile_cache_save_format()
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    assert envs.disable_compile_cache()
    monkeypatch.setenv("VGC_DISABLE_COMPILE_CACHE", "0")
    assert not envs.disable_compile_cache()
    monkeypatch.setenv("VGC_DISABLE_COMPILE_CACHE", "maybe")
    with pytest.raises(ValueError, match="VGC_DISABLE_COMPILE_CACHE"):
        envs.disable_compile_cache()
