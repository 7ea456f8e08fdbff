"""20 unmodified transformers families, three ways each: drop-in `torch.compile(backend="vgc")`, drop-in split at
SDPA, and `vgc.compile` with compile ranges over sizes on both sides of the family's size conditions. Each must
give eager's outputs (fp32, `FP32_TOL`) and never crash; `vgc.compile` must not trace or compile after warm-up.

About 8 minutes on 2 cores (60 cold Inductor compiles and more), so the README's suite leaves it out (marker
`extended`) and `.ci/run` runs it as a second step: `pytest -q -n auto -m extended`.
"""

import pytest
import torch

import vgc
from conftest import FP32_TOL

pytest.importorskip("transformers")
from families import FAMILIES  # noqa: E402

pytestmark = pytest.mark.extended

SDPA = "aten::scaled_dot_product_attention"
_MODELS: dict[str, torch.nn.Module] = {}


def _model(family) -> torch.nn.Module:
    if family.name not in _MODELS:
        torch.manual_seed(0)
        _MODELS[family.name] = family.build().eval()
    return _MODELS[family.name]


def _sdpa_calls(model, inputs) -> int:
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counting
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    return len(calls)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_dropin(family, no_cache, fresh_counters):
    model = _model(family)
    backend = vgc.VgcBackend(vgc.CompilationConfig())
    compiled = torch.compile(model, backend=backend)
    inputs = family.make_inputs(family.sizes[0])
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs), model(**inputs), **FP32_TOL)
    assert backend.graphs and vgc.counters.inductor_compiles > 0


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_split_at_sdpa(family, no_cache, fresh_counters):
    model = _model(family)
    backend = vgc.VgcBackend(vgc.CompilationConfig(splitting_ops=[SDPA]))
    compiled = torch.compile(model, backend=backend)
    inputs = family.make_inputs(family.sizes[1])
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs), model(**inputs), **FP32_TOL)
    # Every SDPA call eager ran is an eager piece of the split graphs (Gemma2's eager attention has none).
    split = sum(p.is_splitting for graph in backend.graphs for p in graph.pieces)
    assert split == _sdpa_calls(model, inputs)
    assert (split == 0) == (family.name == "gemma2")


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_compile_ranges(family, no_cache, fresh_counters):
    model = _model(family)
    compiled = vgc.compile(model, {"compile_ranges_max_size": family.max_size}, dynamic_arg_dims=family.dynamic)
    report = compiled.warmup(family.make_inputs, trace_size=family.sizes[1])
    ranges = report.get("compile_ranges", [])
    assert ranges[0]["sizes"][0] == 2 and ranges[-1]["sizes"][1] == family.max_size
    assert all(a["sizes"][1] + 1 == b["sizes"][0] for a, b in zip(ranges, ranges[1:]))   # no gaps
    assert vgc.counters.dynamo_traces == len(ranges)   # one trace per range
    assert len(ranges) >= family.ranges, f"{family.name}: expected its size conditions to split the sizes"
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0), torch.no_grad():
        for n in family.sizes:
            inputs = family.make_inputs(n)
            torch.testing.assert_close(compiled(**inputs), model(**inputs), **FP32_TOL)
    if family.ranges > 1:   # the sizes checked are served by different traces
        served = {next(i for i, r in enumerate(ranges) if r["sizes"][0] <= n <= r["sizes"][1])
                  for n in family.sizes}
        assert len(served) == len(family.sizes)
