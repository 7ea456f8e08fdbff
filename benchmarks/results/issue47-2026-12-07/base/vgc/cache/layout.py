"""The cache's layout on disk: directory and file names, the trust check every directory passes before anything is
loaded from it, and how files appear there (private directories, whole files or none)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

CACHE_SUBDIR = "torch_compile_cache"   # <root>/torch_compile_cache/<entry hash>/<rank dir>/
LOCK_DIR = "locks"
INDEX_FILE = "index.json"
FACTORS_FILE = "cache_key_factors.json"
ARTIFACT_DIR = "artifacts"
TRACE_PREFIX, TRACE_SUFFIX = "trace-", ".bin"   # a saved trace: trace-<identity>.bin in a rank dir


def trace_file_name(trace_identity: str) -> str:
    return f"{TRACE_PREFIX}{trace_identity}{TRACE_SUFFIX}"


def saved_trace_files_in(rank_dir: Path) -> list[Path]:
    return sorted(rank_dir.glob(f"{TRACE_PREFIX}*{TRACE_SUFFIX}"))


NOT_A_DIRECTORY = "is not a directory"


def untrusted_reason(path: Path) -> str | None:
    """Why a cache directory must not be loaded from: another user's, or writable by others (anyone who can
    write there can plant code that a start runs). None when it is the caller's own, private directory."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be inspected ({e.strerror})"
    if not stat.S_ISDIR(info.st_mode):
        return NOT_A_DIRECTORY
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'} " \
               f"(mode {stat.S_IMODE(info.st_mode):o})"
    return None


def make_private_dirs(path: Path) -> None:
    """Create `path` and its missing parents readable by the owner only."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass


@contextlib.contextmanager
def atomic_file(path: Path):
    """A binary file object whose contents appear at `path` whole when the block ends, or not at all. A directory
    standing at `path` (vgc's own file names only) is removed first: os.replace cannot put a file over it, and it
    would fail every later write the same way."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)
