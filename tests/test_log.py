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
