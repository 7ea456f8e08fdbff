"""Hashes of installed packages' sources that every process pays for once, remembered per installation under the
cache root: Inductor's torch key (it keys Inductor's caches and every artifact checks it at load; computing it
reads and hashes about 2,000 source files, 0.2-0.4 s) and, on CUDA, Triton's key with its backend (it reads the
whole Triton library, ~0.35 s on the H200, at the first artifact load). The next process on the same installation
reads them back. A memo is named by a signature of every file the hash reads, by name, size and modification
time (stat calls, no reads), so an edit, reinstall or upgrade misses; it carries a check digest, and a damaged
one is computed again."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Callable

import torch

from vgc import _compat
from vgc.cache.layout import atomic_write, make_private_dirs, SOURCE_HASH_DIR
from vgc.counters import counters

logger = logging.getLogger("vgc")

# torch_key hashes each module's file: Python sources and the extension modules that pkgutil lists beside them.
_HASHED_SUFFIXES = (".py", ".so", ".pyd")


def installation_signature(package_dir: str, extra_files: list[str], *, packages_only: bool = True,
                           facts: str = "") -> str:
    """A digest of the files a key can read under `package_dir` (with `packages_only`, the Python modules of its
    packages, as pkgutil walks them; else every file), `extra_files`, and `facts` (versions, a device)."""
    h = hashlib.sha256(f"{torch.__version__}\0{package_dir}\0{facts}\n".encode())
    for dirpath, dirnames, files in os.walk(package_dir):
        if packages_only:   # headers and libraries (most of torch's files) are not read
            dirnames[:] = [d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "__init__.py"))]
        dirnames.sort()
        for name in sorted(files):
            if not packages_only or name.endswith(_HASHED_SUFFIXES):
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


def _encode(value: bytes) -> bytes:
    text = value.hex()
    return f"{text} {hashlib.sha256(text.encode()).hexdigest()[:16]}\n".encode()


def _decode(data: bytes) -> bytes | None:
    """The value a memo holds; None when the file is damaged (its check digest does not match)."""
    try:
        text, check = data.decode().split()
        value = bytes.fromhex(text)
    except ValueError:
        return None
    return value if value and hashlib.sha256(text.encode()).hexdigest()[:16] == check else None


def _remember(memo: Path, preset: Callable[[bytes], bool], compute: Callable[[], bytes]) -> bool:
    """Preset the value `memo` holds (True), or compute it and write the memo for the next process (False)."""
    try:
        value = _decode(memo.read_bytes())
    except OSError:
        value = None
    if value is not None and preset(value):
        counters.add(source_hashes_remembered=1)
        return True
    try:
        make_private_dirs(memo.parent)
        atomic_write(memo, _encode(compute()))
    except OSError as e:
        logger.debug("%s not remembered: %s", memo, e)
    return False


@functools.cache
def remember_torch_key(root: Path) -> bool:
    """Hand Inductor the torch key remembered under `root` for this installation (True), or compute and
    remember it (False). A torch without the private names computes it as usual."""
    try:
        package_dir, extra_files = _compat.torch_key_hashed_files()
        memo = root / SOURCE_HASH_DIR / f"torch-{installation_signature(package_dir, extra_files)}"
    except (AttributeError, ImportError, OSError) as e:
        logger.debug("torch key not remembered: %s", e)
        return False
    return _remember(memo, _compat.preset_torch_key, _compat.torch_key)


@functools.cache
def remember_triton_key(root: Path) -> bool:
    """The same for Triton's key with its backend's (the compiler version and the GPU's architecture), on a
    machine with a CUDA GPU and Triton."""
    if not torch.cuda.is_available():
        return False
    try:
        package_dir = _compat.triton_package_dir()
        if package_dir is None:
            return False
        facts = f"{torch.cuda.get_device_capability()}\0" + "\0".join(
            f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("TRITON_"))
        signature = installation_signature(package_dir, [], packages_only=False, facts=facts)
        memo = root / SOURCE_HASH_DIR / f"triton-{signature}"
    except (AttributeError, ImportError, OSError, RuntimeError) as e:
        logger.debug("triton key not remembered: %s", e)
        return False
    return _remember(memo, lambda value: _compat.preset_triton_hash(value.decode()),
                     lambda: _compat.triton_hash().encode())
