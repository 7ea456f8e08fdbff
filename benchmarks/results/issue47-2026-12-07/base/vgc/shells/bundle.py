"""One-file cache bundles: `vgc cache pack` writes a root's entries (and the kernels they load) into one file
with a manifest, `vgc cache unpack` installs one under another root, on another machine.

A bundle is an uncompressed tar: `manifest.json` first, then the files under their paths in a root
(`torch_compile_cache/<hash>/...`, `inductor_cache/...`). The manifest holds, per entry, the key factors its
start will compare (versions of vgc, Python, torch, Triton and CUDA, the GPU or CPU ISA, the world size, the
configuration and source digests) and its rank directories, and per file its size and sha256. Packing is
reproducible: members sorted, no times, owners or modes. Locks, temporary files and this machine's probe
markers stay behind.

Unpacking checks everything before installing anything (`bundle_check`): the manifest as data
(`bundle_manifest`), the tar whole, every file against the manifest (and nothing in the bundle that the manifest
does not list), each entry's index and saved traces against the files (an entry damaged before its hashes were
recomputed), the manifest against each entry's own factors file, and each entry's factors against this machine (a
bundle for another torch or GPU would only ever miss). A refused bundle names its problems and changes nothing:
the next start compiles as if cold. An accepted one is extracted into a staging directory in the root, and moved
into place once every entry's lock is held: kernels first (a missing or damaged one), then each entry. A problem
of the root (read-only, full, a lock held too long) is a `RootError`, never blamed on the bundle.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from filelock import FileLock, Timeout

from vgc._version import __version__
from vgc.cache import inventory, json_data, recovery
from vgc.cache.cpu_isa import MARKER_DIR as ISA_MARKER_DIR
from vgc.cache.layout import (atomic_file, CACHE_SUBDIR, FACTORS_FILE, INDEX_FILE, LOCK_DIR, make_private_dirs,
                              saved_trace_files_in, untrusted_reason)
from vgc.cache.recovery import INDUCTOR_SUBDIR
from vgc.cache.store import content_hash, factors_problem
from vgc.shells import bundle_manifest, verify
from vgc.shells.bundle_check import check, ExtractError, MANIFEST_NAME

logger = logging.getLogger("vgc")

BUNDLE_FORMAT = bundle_manifest.FORMAT
BUNDLE_VERSION = bundle_manifest.VERSION
LOCK_WAIT_S = 60.0   # how long unpack waits for an entry lock another process holds, then gives up
_STAGING, _REPLACED = ".vgc-unpack-", ".vgc-replaced-"   # + "<pid>-": what a killed unpack leaves in the root


class BundleError(Exception):
    """A bundle that cannot be installed; `problems` says why, one reason each."""

    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = Path(path), problems
        super().__init__(f"{path}: " + "; ".join(problems))


class RootError(Exception):
    """The root cannot take a bundle (read-only, full, untrusted, an entry lock held too long): nothing of the
    bundle is wrong. `installed` names the entries installed before the problem (usually none)."""

    def __init__(self, root: Path, problem: str, installed: dict[str, str] | None = None):
        self.root, self.problem, self.installed = Path(root), problem, installed or {}
        super().__init__(f"{root}: {problem}")


# ---- pack ----
def _bundled(relative: PurePosixPath) -> bool:
    """Whether a file under the root travels: not locks, temporary files, hidden files or ISA probe records (whose
    fingerprint names this machine's CPU and interpreter)."""
    name = relative.name
    return LOCK_DIR not in relative.parts and ISA_MARKER_DIR not in relative.parts and not name.startswith(".") \
        and not name.endswith((".lock", ".tmp")) and ".vgc-loads-" not in name


def _files_under(root: Path, top: Path) -> list[tuple[str, Path]]:
    found = []
    for path in sorted(top.rglob("*")):
        relative = PurePosixPath(path.relative_to(root).as_posix())
        if path.is_file() and not path.is_symlink() and _bundled(relative):
            found.append((str(relative), path))
    return found


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o600, 0, 0, "", ""
    return info


def select_entries(root: Path, prefixes: Iterable[str] = ()) -> list[inventory.Entry]:
    """The entries named by hash prefixes (each naming exactly one, as `vgc cache show` takes them), or every entry
    of the root."""
    prefixes = list(prefixes)
    if prefixes:
        return list({e.hash: e for e in (inventory.find_entry(root, p) for p in prefixes)}.values())
    every = sorted(inventory.entries(root), key=lambda e: e.hash)
    if not every:
        raise LookupError(f"no cache entries under {root / CACHE_SUBDIR}")
    return every


def pack(root: Path, output: Path, prefixes: Iterable[str] = (), *, kernels: bool = True) -> dict[str, Any]:
    """Write the chosen entries of `root` (and, with `kernels`, Inductor's kernel cache under it) to `output`, whole
    or not at all; returns the manifest. An entry a start could not load (`vgc cache verify` finds a problem) is
    refused: a bundle must not carry damage to other machines."""
    root, output = Path(root), Path(output)
    if output.is_dir():   # never replaced: it is the user's, not a file vgc wrote
        raise ValueError(f"pack -o {output} names a directory; give a file name, e.g. -o {output / 'cache.vgcb'}")
    chosen = select_entries(root, prefixes)
    damaged = {e.hash: verify.verify_entry(e) for e in chosen}
    damaged = {h: p for h, p in damaged.items() if p}
    if damaged:
        raise ValueError("refusing to pack damaged entries: " + "; ".join(
            f"{h}: {', '.join(p[:3])}" for h, p in damaged.items()) + " (run vgc cache verify, then prune or rebuild)")
    files: list[tuple[str, Path]] = []
    entries: dict[str, Any] = {}
    for entry in chosen:
        stored = entry.manifest()
        if stored is None or factors_problem(stored, entry.hash):
            raise ValueError(f"entry {entry.hash} has no readable {FACTORS_FILE}; it cannot be packed")
        entries[entry.hash] = {"factors": stored["factors"], "ranks": [d.name for d in entry.rank_dirs()]}
        files += _files_under(root, entry.path)
    if kernels and (root / INDUCTOR_SUBDIR).is_dir():
        files += _files_under(root, root / INDUCTOR_SUBDIR)
    listed = {name: {"size": path.stat().st_size, "sha256": content_hash(path)} for name, path in files}
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "vgc_version": __version__,
                "entries": entries, "files": listed}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(output) as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member(MANIFEST_NAME, len(text)), io.BytesIO(text))
        for name, path in files:
            with open(path, "rb") as f:
                tar.addfile(_member(name, listed[name]["size"]), f)
    return manifest


# ---- read and check ----
# ---- unpack ----
def _root_problem(error: OSError, root: Path) -> str:
    """What an OSError while writing under the root says about the root, with the fix."""
    where = f": {error.filename}" if error.filename else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"the cache root {root} has no space or no inodes left ({error.strerror}{where}); free space there "
                "or unpack under another root (--root)")
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"the cache root {root} cannot be written ({error.strerror}{where}); unpack under a writable root "
                "(--root), or make it writable")
    return f"cannot write under the cache root {root} ({error.strerror or error}{where})"


def _inside(path: Path, top: Path) -> None:
    """`RootError` unless `path`, resolved through any symlinks, lies under `top`: nothing is written elsewhere."""
    resolved, limit = path.resolve(), top.resolve()
    if resolved != limit and limit not in resolved.parents:
        raise RootError(top, f"{path} resolves to {resolved}, outside the cache root {limit}; remove that link")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # another user's process: alive
        return True
    return True


def _remove_abandoned(root: Path) -> None:
    """Staging and replaced-entry directories of unpacks that were killed (their process is gone)."""
    for path in root.glob(".vgc-*-*"):
        for prefix in (_STAGING, _REPLACED):
            pid = path.name[len(prefix):].partition("-")[0]
            if path.name.startswith(prefix) and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                logger.info("cache: removed %s, left by an unpack that was killed", path)


@contextlib.contextmanager
def _entry_locks(root: Path, hashes: list[str], wait_s: float):
    """Every entry's lock (`<root>/locks/entry-<hash>.lock`), taken before anything is installed. One that another
    process holds is waited for, with a warning naming it, for at most `wait_s` seconds: then `RootError`."""
    make_private_dirs(root / LOCK_DIR)
    held = []
    try:
        for entry_hash in hashes:
            path = root / LOCK_DIR / f"entry-{entry_hash}.lock"
            lock = FileLock(str(path))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                logger.warning("cache unpack: entry %s is locked by another process (%s); waiting up to %.0f s",
                               entry_hash, path, wait_s)
                try:
                    lock.acquire(timeout=wait_s)
                except Timeout:
                    raise RootError(root, f"entry {entry_hash}'s lock {path} was still held by another process "
                                          f"after {wait_s:.0f} s (another vgc cache unpack of this entry?); let it "
                                          "finish, then unpack again") from None
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


def unpack(path: Path, root: Path, *, lock_wait_s: float | None = None) -> dict[str, str]:
    """Install a bundle under `root`; returns what happened per entry ("installed"; "replaced": the entry there was
    damaged or lacked artifacts or traces the bundle has; "kept": an intact copy holding all of the bundle's was
    already there). Raises `BundleError` when the bundle is refused and `RootError` when the root cannot take it
    (an entry lock held longer than `lock_wait_s`, default `LOCK_WAIT_S`, included); nothing is installed then.
    The staging directory is removed on every exit; one left by a killed unpack is removed by the next."""
    root = Path(root)
    for directory in (root, root / CACHE_SUBDIR, root / INDUCTOR_SUBDIR):
        untrusted = untrusted_reason(directory) if directory.exists() else None
        if untrusted:
            raise RootError(root, f"{directory} {untrusted}; use a directory only you can write")
    try:
        make_private_dirs(root / CACHE_SUBDIR)
        _remove_abandoned(root)
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING}{os.getpid()}-", dir=root))
    except OSError as error:
        raise RootError(root, _root_problem(error, root)) from None
    try:
        try:
            bundle = check(path, into=staging)
        except ExtractError as error:
            raise RootError(root, "the bundle cannot be extracted under the root: "
                            + _root_problem(error.error, root)) from None
        if bundle.problems:
            raise BundleError(path, bundle.problems)
        hashes = sorted(bundle.entries)
        for entry_hash in hashes:
            _inside(root / CACHE_SUBDIR / entry_hash, root)
        with _entry_locks(root, hashes, LOCK_WAIT_S if lock_wait_s is None else lock_wait_s):
            kernels = _kernel_moves(root, staging)
            outcome: dict[str, str] = {}
            try:
                for source, destination in kernels:   # first: an entry never starts without the kernels it came with
                    _move_kernel(source, destination)
                for entry_hash in hashes:
                    outcome[entry_hash] = _install_entry(root, staging, entry_hash)
            except OSError as error:
                raise RootError(root, _root_problem(error, root), outcome) from None
            return outcome
    except OSError as error:
        raise RootError(root, _root_problem(error, root)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _kernel_moves(root: Path, staging: Path) -> list[tuple[Path, Path]]:
    """(extracted file, its place under the root) for each of Inductor's kernel files in the bundle, every place
    checked to lie under the root's kernel cache before any is written."""
    kernels = staging / INDUCTOR_SUBDIR
    if not kernels.is_dir():
        return []
    make_private_dirs(root / INDUCTOR_SUBDIR)
    moves = [(source, root / source.relative_to(staging)) for source in sorted(kernels.rglob("*")) if source.is_file()]
    for _, destination in moves:
        _inside(destination.parent, root / INDUCTOR_SUBDIR)
    return moves


def _move_kernel(source: Path, destination: Path) -> None:
    """Kernels are named by a hash of their source: an intact one already there is as good and stays; a damaged
    one (or a directory in its place) is replaced."""
    if os.path.lexists(destination):
        if not (destination.is_dir() or recovery.file_problem(destination)):
            return
        _remove(destination)
    make_private_dirs(destination.parent)
    os.replace(source, destination)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _install_entry(root: Path, staging: Path, entry_hash: str) -> str:
    target, new = root / CACHE_SUBDIR / entry_hash, staging / CACHE_SUBDIR / entry_hash
    if not os.path.lexists(target):
        os.replace(new, target)
        return "installed"
    if target.is_dir() and not target.is_symlink() and not verify.verify_entry(inventory.Entry(target)):
        lacking = _lacking(target, new)
        if lacking is None:
            return "kept"
        logger.info("cache unpack: entry %s here lacks %s; replacing it with the bundle's", entry_hash, lacking)
    old = Path(tempfile.mkdtemp(prefix=f"{_REPLACED}{os.getpid()}-{entry_hash}-", dir=root))
    os.replace(target, old / entry_hash)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)
    return "replaced"


def _lacking(local: Path, bundled: Path) -> str | None:
    """What the bundle's copy of an entry holds that the intact copy here does not (a rank directory, an artifact,
    a saved trace), or None: a copy left partial by a start that was stopped must not win over a complete one."""
    for rank in sorted(p for p in bundled.iterdir() if p.is_dir()):
        here = local / rank.name
        if not here.is_dir():
            return f"rank directory {rank.name}"
        wanted = set(_index_records(rank)) - set(_index_records(here))
        if wanted:
            return f"{len(wanted)} artifact(s) of {rank.name}, e.g. {min(wanted)}"
        traces = [p.name for p in saved_trace_files_in(rank) if not (here / p.name).is_file()]
        if traces:
            return f"the saved trace {rank.name}/{traces[0]}"
    return None


def _index_records(rank_dir: Path) -> dict[str, Any]:
    try:
        index = json_data.loads((rank_dir / INDEX_FILE).read_bytes())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}
