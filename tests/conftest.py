"""Shared test setup. Inductor's cache lives in one directory per test session: a fresh one costs ~8.5 s of
CPU-ISA probing, paid once per session instead of once per test (subprocesses inherit it)."""

import os
import tempfile

_SESSION_DIR = tempfile.mkdtemp(prefix="vgc-tests-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_SESSION_DIR, "inductor"))
os.environ.setdefault("VGC_CACHE_ROOT", os.path.join(_SESSION_DIR, "vgc-cache"))
for _var in ("VLLM_DISABLE_COMPILE_CACHE", "VGC_DISABLE_COMPILE_CACHE", "VLLM_COMPILE_CACHE_SAVE_FORMAT",
             "VGC_COMPILE_CACHE_SAVE_FORMAT"):
    os.environ.pop(_var, None)

import pytest  # noqa: E402
import torch  # noqa: E402

import vgc  # noqa: E402

# fp32 on CPU: Inductor reorders reductions and fuses ops, so results differ from eager by rounding only.
FP32_TOL = dict(atol=2e-5, rtol=2e-5)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_counters():
    vgc.counters.reset()
    torch._dynamo.reset()
    yield vgc.counters


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("VGC_DISABLE_COMPILE_CACHE", "1")
