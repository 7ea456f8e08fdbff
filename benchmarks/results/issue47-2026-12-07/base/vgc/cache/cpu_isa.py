"""Inductor's CPU vector-ISA probe, remembered in the cache: a probe that succeeded once on this machine is not
run again by the next process."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys

import torch

from vgc import _compat


@functools.cache
def remember_cpu_isa_probes() -> None:
    """Every process that compiles or loads CPU kernels runs Inductor's vector-ISA check: a subprocess per ISA
    that loads a test library (about 1.5 s in all with torch >= 2.13, where the child only `dlopen`s it; about
    10 s before 2.13, where the child imports torch: most of a warm start on CPU). Its answer depends only on the
    library, this machine and torch, so a success is recorded under a fingerprint of the CPU and torch (beside
    the library from 2.13, in Inductor's cache before), and the next process skips the subprocess. A record
    copied to another machine never matches."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = sorted({line for line in f if line.startswith(("flags", "model name", "Features"))})
    except OSError:
        return   # no fingerprint, no memory: Inductor probes as usual
    fingerprint = hashlib.sha256(repr((cpu, platform.machine(), torch.__version__, sys.executable)).encode())
    marker_suffix = f".vgc-loads-{fingerprint.hexdigest()[:16]}"

    def remembering(probe):
        def probe_load(self, output_path: str) -> bool:
            marker = output_path + marker_suffix
            if os.path.isfile(output_path) and os.path.isfile(marker):
                return True
            loaded = probe(self, output_path)
            if loaded:
                _mark(marker)
            return loaded
        return probe_load

    def remembering_check(check):
        def check_build(self, code: str) -> bool:
            # The compiler and its flags for this ISA are part of what passed: Inductor's C++ compiler choice and
            # the ISA's name (its flags follow from it) go into the record's name with the CPU and torch.
            what = repr((fingerprint.hexdigest(), str(self), code, _compat.inductor_cpp_compiler()))
            marker = os.path.join(_compat.inductor_cache_dir(), MARKER_DIR,
                                  hashlib.sha256(what.encode()).hexdigest()[:32])
            if os.path.isfile(marker):
                return True
            built = check(self, code)
            if built:
                _mark(marker)
            return built
        return check_build

    if not _compat.wrap_cpu_isa_probe(remembering):
        _compat.wrap_cpu_isa_check(remembering_check)


# Where torch < 2.13's whole-check successes are recorded, under Inductor's cache directory.
MARKER_DIR = "vgc-cpu-isa"


def _mark(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("loaded\n")
    except OSError:
        pass   # an unwritable cache only costs the next process the probe
