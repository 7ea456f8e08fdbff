"""vgc's log lines read `vgc: ...` exactly once, whether or not the application configured logging."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("setup, expected", [
    ("", "vgc: cache miss\n"),                                                       # nothing configured
    ("logging.basicConfig(format='%(name)s: %(message)s')", "vgc: cache miss\n"),     # the application's format
    ("logging.basicConfig(format='%(levelname)s %(message)s')", "WARNING cache miss\n"),
])
def test_one_vgc_prefix(setup, expected):
    code = f"import logging, vgc\n{setup}\nlogging.getLogger('vgc').warning('cache miss')\n" \
           "logging.getLogger('vgc').info('not shown at the default level')\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == expected


def test_cpu_graph_mode_warning_is_given_once(caplog, monkeypatch, no_cache, fresh_counters):
    """A graph mode on the CPU is said once, not once per graph Dynamo hands the backend (a graph break makes two;
    the drop-in builds a backend per graph) nor once per model."""
    import logging

    import torch

    from vgc import log

    monkeypatch.setattr(log, "_warned", set())

    def forward(x):
        y = torch.relu(x) + 1
        torch._dynamo.graph_break()
        return y * 2

    with caplog.at_level(logging.WARNING, logger="vgc"):
        for _ in range(2):
            compiled = torch.compile(forward, backend="vgc", options={"cudagraph_mode": "full"})
            assert torch.equal(compiled(torch.ones(3)), forward(torch.ones(3)))
            torch._dynamo.reset()
    said = [r.getMessage() for r in caplog.records if "needs a CUDA device" in r.getMessage()]
    assert said == ["cudagraph_mode=full needs a CUDA device; this cpu model runs without CUDA graphs"], said
