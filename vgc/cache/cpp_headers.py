"""Inductor's precompiled C++ header, remembered between processes while artifacts load.

Before it looks a CPU kernel up, Inductor names the header its kernels are built with by a hash of the
preprocessed headers: every process runs the preprocessor over torch's headers (0.15 s of a warm start on a 2-core
CPU). Yet the header only serves to build a kernel that is missing, and the kernel's key does not include it.
While an artifact loads, the header's path comes from a record an earlier process wrote beside the headers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from vgc import _compat
from vgc.cache.layout import atomic_write, make_private_dirs

RECORDS_DIR = "vgc-known"   # under Inductor's header directory


@contextlib.contextmanager
def headers_remembered():
    """The block's artifact loads take Inductor's precompiled header from a record of an earlier process. A record
    is named by what the header is made from (the header, its command, torch's build, the header file's and the
    compiler's size and time); one that is unreadable, or whose header or its compiled form is gone, is made
    again the ordinary way and rewritten; a directory that cannot be written only costs the next process the
    preprocessor run."""
    with _compat.precompile_header_wrapped(_remembering):
        yield


def _remembering(precompile: Callable[..., str], header_dir: str) -> Callable[..., str]:
    records = Path(header_dir) / RECORDS_DIR

    def precompile_header(*args: Any, **compile_command: Any) -> str:
        if len(args) != 2 or not all(isinstance(a, str) for a in args):   # a torch that calls it otherwise
            return precompile(*args, **compile_command)
        header, hashable_cmd_line = args
        record = records / _made_from(header, hashable_cmd_line, compile_command)
        try:
            made = record.read_text(encoding="utf-8")
            if os.path.isfile(made) and any(os.path.isfile(made + ext) for ext in (".gch", ".pch")):
                return made
        except (OSError, UnicodeDecodeError, ValueError):
            pass
        made = precompile(header, hashable_cmd_line, **compile_command)
        try:
            make_private_dirs(records)
            atomic_write(record, made.encode())
        except OSError:
            pass
        return made
    return precompile_header


def _made_from(header: str, hashable_cmd_line: str, compile_command: dict) -> str:
    def stat(path: str):
        try:
            status = os.stat(path)
        except OSError:
            return None
        return status.st_size, status.st_mtime_ns
    source = os.path.join(os.path.dirname(torch.__file__), "include", header)
    # a vector ISA's repr shows a function's address, which differs between processes
    options = sorted((k, re.sub(r" at 0x[0-9a-fA-F]+", "", repr(v))) for k, v in compile_command.items())
    what = (header, hashable_cmd_line, options, torch.__version__, torch.version.git_version, stat(source),
            _compat.inductor_cpp_compiler())
    return hashlib.sha256(repr(what).encode()).hexdigest()[:32]
