"""Inductor's hash of torch's sources, remembered per torch installation: every process that computes a cache key
or loads an artifact needs it, and computing it reads and hashes about 2,000 source files (0.2-0.4 s of a warm
start). The next process on the same installation reads it back instead."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

import torch

from vgc import _compat
from vgc.cache.layout import atomic_write, make_private_dirs, TORCH_KEY_DIR
from vgc.counters import counters

logger = logging.getLogger("vgc")

# torch_key hashes each module's file: Python sources and the extension modules that pkgutil lists beside them.
_HASHED_SUFFIXES = (".py", ".so", ".pyd")


def installation_signature(package_dir: str, extra_files: list[str]) -> str:
    """A digest of every file the key can read, by name, size and modification time: cheap to take (stat calls,
    no reads), and any edit, reinstall or upgrade of torch changes it."""
    h = hashlib.sha256(f"{torch.__version__}\0{package_dir}\n".encode())
    for dirpath, dirnames, files in os.walk(package_dir):
        # the key descends into packages only (pkgutil): headers and libraries (most of torch's files) are not read
        dirnames[:] = sorted(d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "__init__.py")))
        for name in sorted(files):
            if name.endswith(_HASHED_SUFFIXES):
                _add_stat(h, os.path.join(dirpath, name))
    for path in extra_files:
        _add_stat(h, path)
    return h.hexdigest()[:32]


def _add_stat(h, path: str) -> None:
    try:
        info = os.stat(path)
    except OSError:
        h.update(f"{path}\0missing\n".encode())
        return
    h.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())


def _encode(key: bytes) -> bytes:
    text = key.hex()
    return f"{text} {hashlib.sha256(text.encode()).hexdigest()[:16]}\n".encode()


def _decode(data: bytes) -> bytes | None:
    """The key a memo holds; None when the file is damaged (its check digest does not match)."""
    try:
        text, check = data.decode().split()
        key = bytes.fromhex(text)
    except ValueError:
        return None
    return key if key and hashlib.sha256(text.encode()).hexdigest()[:16] == check else None


@functools.cache
def remember_torch_key(root: Path) -> bool:
    """Hand Inductor the key remembered under `root` for this installation (True), or compute it and remember it
    for the next process (False). A damaged or unwritable memo only costs the computation."""
    try:
        package_dir, extra_files = _compat.torch_key_hashed_files()
        memo = root / TORCH_KEY_DIR / installation_signature(package_dir, extra_files)
    except (AttributeError, ImportError, OSError) as e:   # a torch without the private names: compute as usual
        logger.debug("torch key not remembered: %s", e)
        return False
    try:
        key = _decode(memo.read_bytes())
    except OSError:
        key = None
    if key is not None and _compat.preset_torch_key(key):
        counters.add(torch_keys_remembered=1)
        return True
    try:
        make_private_dirs(memo.parent)
        atomic_write(memo, _encode(_compat.torch_key()))
    except OSError as e:
        logger.debug("torch key not remembered in %s: %s", memo, e)
    return False
