"""docs/encoder.md's "Your own encoder" runs as written: its adapter serves its model through the manager (graph
replays through the CPU stand-in), every image equal to the model's own forward, the adapter within 120 lines."""

import re
from pathlib import Path

import torch

PAGE = Path(__file__).resolve().parents[2] / "docs" / "encoder.md"
TOL = dict(atol=1e-5, rtol=1e-5)   # fp32; padding and compiled pieces change rounding only


def walkthrough() -> str:
    section = PAGE.read_text().split("\n## Your own encoder\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_minimal_adapter_is_short_and_formatted():
    code = walkthrough()
    adapter = code.split("class PatchEncoderAdapter", 1)[1].split("\n\n\n", 1)[0]
    assert len(adapter.splitlines()) <= 120
    assert max(len(line) for line in code.splitlines()) <= 120


def test_the_walkthrough_serves_every_image_as_the_model_computes_it(simulated_capture, fresh_counters, no_cache):
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(walkthrough(), str(PAGE), "exec"), scope)
    manager, model, mm_kwargs = scope["manager"], scope["model"], scope["mm_kwargs"]
    assert manager.stats()["captured_forward"] == {"default": "compiled"} and fresh_counters.cudagraph_captures > 0
    lengths = mm_kwargs["lengths"].tolist()
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    with torch.no_grad():
        want = [model(mm_kwargs["patches"][a:b], torch.tensor([0, b - a], dtype=torch.int32), b - a)
                for a, b in zip(bounds, bounds[1:])]
    got = scope["per_image"]
    assert [tuple(g.shape) for g in got] == [(n, 64) for n in lengths]
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, **TOL, msg=f"image {i}")
    stats = manager.stats()
    assert stats["path_items"]["default"]["eager"] == 1 and stats["path_items"]["default"]["replayed"] == 3
