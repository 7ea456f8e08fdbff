"""Damage under a cache root that vgc can detect without running anything: what `vgc cache verify` reports and
what a start removes before Inductor would trip over it.

Inductor's own cache (`<root>/inductor_cache/`, and Triton's under it on CUDA) holds compiled kernels that a
killed compile can leave half-written (a 0-byte `.so` fails every later import with "file too short") and that a
start loads without a checksum. Only files whose damage is certain are judged: empty files, shared objects
without an ELF header, unreadable files, dangling or looping symlinks. Anything else Inductor reads is its own
business (it keys files by content hash).
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path

from vgc import _compat
from vgc.cache import kernel_hashes

logger = logging.getLogger("vgc")

INDUCTOR_SUBDIR = "inductor_cache"
_ELF_MAGIC = b"\x7fELF"
# Zero-length files Inductor writes on purpose (markers, empty package files).
_EMPTY_OK_SUFFIXES = (".lock", "__init__.py", ".marker", ".done", ".load_ok")   # .load_ok: torch 2.14+ ISA probe
# Inductor's kernel files: a directory with such a name is damage (nothing of Inductor's is named so).
_FILE_SUFFIXES = (".py", ".so", ".cpp", ".h", ".json", ".o", ".cubin", ".ptx", ".lock")
# Where Inductor keeps its cache entries (`fxgraph/<2 chars>/<key>/<file>`, `aotautograd/<key>/<file>`): files
# only, so a directory there is damage too, whatever its name.
_FILES_ONLY = {("fxgraph", 3), ("aotautograd", 2)}


def file_problem(path: Path, deep: bool = False) -> str | None:
    """What is certainly wrong with one file under Inductor's cache, or None. `deep` also parses Python files
    (what `vgc cache verify` does; a start only looks at sizes and headers, which costs no time)."""
    try:
        if path.is_symlink() and not path.exists():
            return "dangling or looping symlink"
        size = path.stat().st_size
        if size == 0 and not path.name.endswith(_EMPTY_OK_SUFFIXES):
            return "empty file (a write that was interrupted)"
        if path.suffix == ".so":
            with open(path, "rb") as f:
                header = f.read(64)
            if header[:4] != _ELF_MAGIC:
                return "not a shared object (no ELF header)"
            end = _elf_section_table_end(header)
            if end is not None and end > size:   # the section table is written last: a cut file lacks it
                return f"truncated shared object ({size} bytes, its ELF header says at least {end})"
        elif not os.access(path, os.R_OK):
            return "unreadable"
        elif deep and path.suffix == ".py":
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)   # parses only: nothing runs
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    except (SyntaxError, ValueError) as e:   # ValueError: null bytes, undecodable text
        return f"not valid Python ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    return None


def _elf_section_table_end(header: bytes) -> int | None:
    """Where an ELF file's section header table ends, from its first 64 bytes; None if the header is cut."""
    if len(header) < 52 or header[5] not in (1, 2):
        return None
    order = "little" if header[5] == 1 else "big"
    if header[4] == 2 and len(header) >= 64:   # ELF64
        offset, entry, count = header[0x28:0x30], header[0x3A:0x3C], header[0x3C:0x3E]
    elif header[4] == 1:   # ELF32
        offset, entry, count = header[0x20:0x24], header[0x2E:0x30], header[0x30:0x32]
    else:
        return None
    return int.from_bytes(offset, order) + int.from_bytes(entry, order) * int.from_bytes(count, order)


def kernel_cache_problems(root: Path, deep: bool = False) -> list[tuple[Path, str]]:
    """(path, problem) for every damaged file under `<root>/inductor_cache/` (`deep`: see `file_problem`)."""
    base = Path(root) / INDUCTOR_SUBDIR
    found = []
    for directory, dirnames, filenames in os.walk(base, onerror=lambda e: found.append(
            (Path(e.filename or base), f"unreadable directory ({e.strerror})"))):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(directory, d))]:
            path = Path(directory, name)
            problem = file_problem(path, deep)
            if problem:
                found.append((path, problem))
        parts = Path(directory).relative_to(base).parts
        files_only = bool(parts) and (parts[0], len(parts)) in _FILES_ONLY
        for name in [d for d in dirnames if (files_only or d.endswith(_FILE_SUFFIXES))
                     and not os.path.islink(os.path.join(directory, d))]:
            found.append((Path(directory, name), "a directory where a file of Inductor's cache goes"))
            dirnames.remove(name)
    return found


def remove_damaged_kernels(root: Path) -> int:
    """Remove what `kernel_cache_problems` finds (Inductor rebuilds it); one warning per path. Returns the count."""
    removed = 0
    for path, problem in kernel_cache_problems(root):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as e:
            logger.warning("cache: %s is %s and could not be removed (%s)", path, problem, e.strerror or e)
            continue
        kernel_hashes.forget(Path(root), Path(root) / INDUCTOR_SUBDIR, path)
        logger.warning("cache: removed %s (%s); Inductor rebuilds it", path, problem)
        removed += 1
    return removed


_moved_off: dict[Path, str] = {}   # root -> the private directory its Inductor cache moved to, in this process


def move_kernel_cache_off(root: Path, why: str) -> str:
    """Point Inductor's kernel cache at a private temporary directory for the rest of the process, after a write
    under `root` failed or cannot succeed (a full disk, a read-only root): compiling and loading go on, nothing more
    is saved there. Once per root and process: one directory, one warning."""
    root = Path(root)
    directory = _moved_off.get(root)
    if directory is None:
        directory = _moved_off[root] = tempfile.mkdtemp(prefix="vgc-inductor-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)   # its kernels are this process's only
        _link_kernels(root / INDUCTOR_SUBDIR, Path(directory))
        logger.warning("cache: cannot write under %s (%s); Inductor's kernels go to %s for this process, and "
                       "nothing is saved under the root (what is there still loads)", root, why, directory)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != directory:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
        _clear_inductor_memory()
    return directory


def _link_kernels(kernels: Path, private: Path) -> None:
    """Make the root's kernels visible in the private directory, a symlink per intact file in directories of the
    same names: Inductor finds the kernels it built before instead of building them again (on the CPU, a C++
    compile each: a warm start of the tiny decoder took 17-24 s without them, 2 s with them). Inductor writes by
    renaming a temporary file over its target, so a write replaces the link, never the root's file. Left out: lock
    files, which Inductor opens for writing, and hidden files, which are its temporary files (one left by a write
    the full disk refused has the name this process's next write opens)."""
    for directory, dirnames, filenames in os.walk(kernels, onerror=lambda error: None):
        dirnames[:] = [d for d in dirnames if d != "locks" and not os.path.islink(os.path.join(directory, d))]
        target = private / Path(directory).relative_to(kernels)
        try:
            target.mkdir(mode=0o700, exist_ok=True)
            for name in filenames:
                path = Path(directory, name)
                if not name.endswith(".lock") and not name.startswith(".") and not path.is_symlink() and \
                        file_problem(path) is None:
                    os.symlink(path, target / name)
        except OSError as error:   # a kernel not linked is built again: time, never correctness
            logger.debug("cache: cannot link %s's kernels into %s (%s)", kernels, target, error)


def moved_off(root: Path) -> str | None:
    """The private directory Inductor's cache uses instead of `root`'s, when this process moved it off because the
    root cannot take writes; else None."""
    return _moved_off.get(Path(root))


def full_disk(path: Path) -> str | None:
    """Why the file system holding `path` can take no file at all (no free blocks or no free inodes), or None. A
    disk with a little room left is found when a write fails instead."""
    try:
        info = os.statvfs(path)
    except (OSError, AttributeError):   # AttributeError: no statvfs on this platform
        return None
    if info.f_bavail == 0:
        return f"{os.strerror(errno.ENOSPC)}: its disk is full"
    if info.f_files > 0 and info.f_favail == 0:   # f_files 0: a file system without an inode count
        return f"{os.strerror(errno.ENOSPC)}: no inodes left on its disk"
    return None


def _clear_inductor_memory() -> None:
    _compat.clear_inductor_memory_caches()   # in-memory caches hold modules and paths of the files on disk


def error_chain(error: BaseException | None, limit: int = 20):
    """`error`, then what caused it (`__cause__`, else `__context__`), and so on: Inductor and Dynamo wrap what
    they raise. `limit` bounds a chain that loops."""
    while error is not None and limit > 0:
        yield error
        error = error.__cause__ or error.__context__
        limit -= 1


def files_named_in(error: BaseException, root: Path) -> list[Path]:
    """Files under `<root>/inductor_cache/` that `error` (or what caused it) names or was raised in: the files a
    failed load or compile read, which are the suspects when the cause is not certain."""
    base = os.path.realpath(Path(root) / INDUCTOR_SUBDIR) + os.sep
    names = set()
    for link in error_chain(error):
        for attr in ("filename", "filename2", "path"):
            value = getattr(link, attr, None)
            if isinstance(value, (str, os.PathLike)):
                names.add(os.fspath(value))
        names.update(_frame_files(link))
    return sorted(Path(n) for n in names if os.path.realpath(n).startswith(base) and os.path.lexists(n))


def remove_suspects(error: BaseException, root: Path) -> int:
    """Remove the damaged files under the root's kernel cache and those `error` names; returns how many."""
    removed = remove_damaged_kernels(root)
    for path in files_named_in(error, root):
        try:
            path.unlink()
        except OSError:
            continue
        logger.warning("cache: removed %s, named by a failed load or compile (%s: %s); Inductor rebuilds it",
                       path, type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
        removed += 1
    if removed:
        _clear_inductor_memory()
    return removed


def raised_reading_a_cache(error: BaseException) -> bool:
    """Whether `error` (or its cause) went through Inductor's or AOTAutograd's cache code: only then can the
    cache's content be the cause, and emptying it a cure (a lowering error is not)."""
    for link in error_chain(error):
        for name in _frame_files(link):
            name = name.replace(os.sep, "/")
            if "/torch/_inductor/" in name and "cache" in name.rsplit("/", 1)[-1] or "autograd_cache" in name:
                return True
    return False


def _frame_files(error: BaseException) -> list[str]:
    """The source files of the frames `error` passed through."""
    files, tb = [], error.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return files


def reset_kernel_cache(root: Path, error: BaseException) -> None:
    """Empty `<root>/inductor_cache/` after a failure no single file explains: every kernel is rebuilt once,
    and later starts are warm again (vgc's own artifacts stay)."""
    base = Path(root) / INDUCTOR_SUBDIR
    logger.warning("cache: a compile failed on Inductor's cache %s (%s: %s); emptying it and compiling again",
                   base, type(error).__name__, (str(error).splitlines() or [""])[0][:200])
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o700, exist_ok=True)
    _clear_inductor_memory()
