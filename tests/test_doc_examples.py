"""The printed outputs in docs/dynamic-shapes.md are what its examples print (tools/doc_examples.py)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "doc_examples.py"
PAGE = REPO / "docs" / "dynamic-shapes.md"

_spec = importlib.util.spec_from_file_location("doc_examples", SCRIPT)
doc_examples = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = doc_examples   # its dataclass looks its module up there
_spec.loader.exec_module(doc_examples)


def test_every_python_block_has_its_output():
    page = PAGE.read_text()
    examples = doc_examples.find_examples(page)
    assert len(examples) == doc_examples.count_python_blocks(page) == 8
    assert all(e.output.strip() for e in examples)


def test_warnings_are_dropped_and_log_lines_kept():
    output = ("n=9\n/x/torch/a.py:3: UserWarning: slow path\n  warnings.warn(\n  \"x\": [\n"
              "WARNING the traced graph holds only when x.size(0) > 4\n")
    assert doc_examples.drop_warnings(output) == (
        "n=9\n  \"x\": [\nWARNING the traced graph holds only when x.size(0) > 4\n")


def test_normalise_masks_what_differs_between_runs():
    a = ('"first_call": 4.056816749999598, /tmp/vgc-example/cache/torch_compile_cache/45c15ff6fb0c6e83af41/r\n'
         "Eq(u0, u1) # mp/vgc-example/example.py:16 in forward (_subclasses/fake_impls.py:1960 in infer_size)\n")
    b = ('"first_call": 7.233226759999525, /tmp/vgc-example/cache/torch_compile_cache/aff9f3931ea7da64fd1a/r\n'
         "Eq(u2, u3) # vgc-example/example.py:16 in forward (torch/_subclasses/fake_impls.py:1960 in infer_size)\n")
    assert doc_examples.normalise(a) == doc_examples.normalise(b)
    assert doc_examples.normalise(a) != doc_examples.normalise(a.replace("example.py:16", "example.py:17"))


# The page records what its examples print under CI's torch, torch's own messages included; another torch (a CUDA
# wheel warns that it finds no CUDA runtime, a newer one words a shape error differently) prints other text.
RECORDED_WITH = "2.13."


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.skipif(not __import__("torch").__version__.startswith(RECORDED_WITH),
                    reason=f"docs/dynamic-shapes.md records outputs of torch {RECORDED_WITH}x, CI's torch")
def test_doc_outputs_are_current():
    # 80-95 s on a 2-core CPU with a fresh Inductor cache, ~60 s with a warm one: seven fresh interpreters
    # (4 s to import torch each), each compiling with Inductor. The session's cache is already probed.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", str(PAGE),
                           "--inductor-cache", os.environ["TORCHINDUCTOR_CACHE_DIR"]],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
