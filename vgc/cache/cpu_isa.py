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
    """Every process that compiles or loads CPU kernels runs Inductor's vector-ISA probe: a subprocess per ISA
    that `dlopen`s a test library (about 1.5 s in all, most of a warm start on CPU). Its answer depends only on
    that library and this machine, so a success is recorded beside the library, under a fingerprint of the CPU
    and torch, and the next process skips the subprocess. A library copied to another machine never matches."""
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
                try:
                    with open(marker, "w") as f:
                        f.write("dlopen ok\n")
                except OSError:
                    pass   # an unwritable cache only costs the next process the probe
            return loaded
        return probe_load

    _compat.wrap_cpu_isa_probe(remembering)
