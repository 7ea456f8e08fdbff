"""Inductor's CPU vector-ISA check runs a subprocess per ISA in every process (torch >= 2.13: a child that only
loads a test library; before: a child that imports torch, about 10 s a start on 2 cores). vgc remembers a check
that passed on this machine. Both torch layouts, through `_compat`'s real wrappers, on stand-in ISA classes (the
real check costs seconds and its result is this machine's)."""

import pytest
import torch._inductor.cpu_vec_isa as cpu_vec_isa

from vgc import _compat
from vgc.cache import cpu_isa


def _isa_class(layout: str, runs: list, passes: list):
    if layout == "probe":   # torch >= 2.13: check_build builds, then calls the load probe
        class ISA:
            def _probe_load(self, output_path):
                runs.append(output_path)
                return passes[0]

            def __str__(self):
                return "avx2"
    else:                   # torch < 2.13: one check_build, whose child imports torch
        class ISA:
            def check_build(self, code):
                runs.append(code)
                return passes[0]

            def __str__(self):
                return "avx2"
    return ISA


@pytest.mark.parametrize("layout", ["probe", "check"])
def test_a_cpu_isa_check_that_passed_is_not_run_again(layout, tmp_path, monkeypatch):
    runs, passes = [], [False]
    isa_class = _isa_class(layout, runs, passes)
    monkeypatch.setattr(cpu_vec_isa, "VecISA", isa_class)
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(tmp_path))
    cpu_isa.remember_cpu_isa_probes.__wrapped__()   # the real wrappers, around the stand-in class

    library = tmp_path / "isa_help.so"
    library.write_bytes(b"\x7fELF")

    def check(what=str(library)):
        isa = isa_class()
        return isa._probe_load(what) if layout == "probe" else isa.check_build(what)

    assert check() is False and check() is False and len(runs) == 2   # a failure is not remembered
    passes[0] = True
    assert check() is True and len(runs) == 3
    assert check() is True and check() is True and len(runs) == 3     # a success is, for later checks
    other = tmp_path / "other.so"
    other.write_bytes(b"\x7fELF")
    assert check(str(other)) is True and len(runs) == 4               # another library or code: checked
    if layout == "probe":
        library.unlink()                                              # the library gone: its record means nothing
        assert check() is True and len(runs) == 5


def test_a_compiler_replaced_under_the_same_name_checks_again(tmp_path, monkeypatch):
    """torch < 2.13 layout: the record names the compiler binary itself, so an upgraded g++ is checked anew."""
    import os

    import torch._inductor.config as inductor_config

    runs = []
    isa_class = _isa_class("check", runs, [True])
    monkeypatch.setattr(cpu_vec_isa, "VecISA", isa_class)
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(tmp_path))
    compiler = tmp_path / "bin" / "c++"
    compiler.parent.mkdir()
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    cpu_isa.remember_cpu_isa_probes.__wrapped__()

    with inductor_config.patch({"cpp.cxx": (None, str(compiler))}):   # restored after, unlike a monkeypatch
        assert isa_class().check_build("code") and isa_class().check_build("code") and len(runs) == 1
        compiler.write_text("#!/bin/sh\n# another version\n")
        os.utime(compiler, ns=(1, 1))
        assert isa_class().check_build("code") and len(runs) == 2
