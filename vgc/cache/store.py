"""The on-disk artifact store of one cache entry: atomic writes, per-artifact locks, an index of content hashes.

Artifacts are executable code (Inductor output is imported and run): only use a cache directory you trust.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from filelock import FileLock

from vgc import _compat, envs
from vgc.cache import json_data, kernel_hashes, recovery
from vgc.cache.cpp_headers import headers_remembered
from vgc.cache.layout import ARTIFACT_DIR, atomic_write, FACTORS_FILE, INDEX_FILE, LOCK_DIR, make_private_dirs
from vgc.log import warn_once

logger = logging.getLogger("vgc")

# Errors that say the disk or the directory cannot take a write: the process goes on without saving.
_UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def _extern_kernels(record: dict[str, Any]) -> list[str] | None:
    """The torch functions the saving process found under Inductor's `extern_kernels`, for a load that defers
    Inductor's compiler; None (the ordinary load) for a record without them or with `VGC_LOAD_WITHOUT_COMPILER=0`."""
    names = record.get("extern_kernels")
    if not envs.load_without_compiler() or not isinstance(names, list):
        return None
    return [n for n in names if isinstance(n, str)]


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}" + (f": {error.filename}" if error.filename else "")
    return f"{type(error).__name__}: {error}"


BINDING = "entry"   # the index record field naming the entry and rank it was written for (`index_binding`)


def index_binding(rank_dir: Path) -> str:
    """What each index record names as the place it was written for: `<entry hash>/<rank dir>`. Two entries of one
    model name their artifacts alike; an index copied or swapped in from another entry (or rank) is told by this,
    instead of by each intact artifact failing a hash that was never its own."""
    return f"{rank_dir.parent.name}/{rank_dir.name}"


def bound_elsewhere(index: dict[str, Any], binding: str) -> list[str]:
    """The other places (`index_binding`) that records of `index` were written for, sorted; records of an older
    vgc, which name none, are taken as this place's."""
    return sorted({r[BINDING] for r in index.values() if isinstance(r, dict) and isinstance(r.get(BINDING), str)
                   and r[BINDING] != binding})


def record_problem(record: Any) -> str | None:
    """What is wrong with an index record's form (not its file), or None."""
    if not isinstance(record, dict):
        return f"a record must be an object, got {type(record).__name__}"
    if BINDING in record and not isinstance(record[BINDING], str):
        return f"bad {BINDING!r} {record[BINDING]!r}"
    name = record.get("file")
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        return f"bad 'file' {name!r}"
    fmt = record.get("format")
    if fmt == "binary":
        if not isinstance(record.get("bytes"), int) or not isinstance(record.get("sha256"), str):
            return "a binary record needs 'bytes' (int) and 'sha256' (str)"
    elif fmt == "unpacked":
        files = record.get("files")
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return "an unpacked record needs 'files' (name -> sha256)"
    else:
        return f"unknown format {fmt!r}"
    return None


def factors_problem(manifest: Any, entry_hash: str) -> str | None:
    """What is wrong with a parsed `cache_key_factors.json` of the entry `entry_hash`, or None."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("hash"), str):
        return 'not a JSON object with a "hash"'
    if not isinstance(manifest.get("factors"), dict):
        return 'no "factors" object'
    if manifest["hash"] != entry_hash:
        return f"records hash {manifest['hash']!r} but lies in entry {entry_hash}"
    return None


def content_hash(path: Path) -> str:
    """sha256 of a file, or of a directory's files (relative names and contents)."""
    h = hashlib.sha256()
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(file.relative_to(path)).encode())
            h.update(file.read_bytes())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Fetched:
    """An artifact and what fetching it did, in `vgc.Counters` names: the caller adds them to its model's record."""
    artifact: Any
    counts: dict[str, int] = field(default_factory=dict)


def _unpacked_manifest(path: Path) -> dict[str, str]:
    # Loading an unpacked artifact compiles .so files into its directory; only what was saved is checked.
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


class Store(Protocol):
    """What the backend and the trace session use of a cache entry: `ArtifactStore` (an entry on disk) and
    `NoStore` (no cache) both are one, so no caller asks which it has."""

    directory: Path | None   # None: nothing is on disk (no debug files, no saved trace)
    saving: bool             # False: nothing is saved (no cache, a read-only view, or a disk that refused a write)

    def load(self, name: str) -> Fetched | None: ...

    def load_or_compile(self, name: str, compile_fn: Callable[[], Any], meta: dict[str, Any]) -> Fetched: ...

    def write_text(self, name: str, text: str) -> Path | None: ...

    def write_factors(self, factors: dict[str, Any]) -> None: ...


class ArtifactStore:
    """Artifacts of one cache entry (`.../torch_compile_cache/<hash>/rank_<r>_<dp>/`)."""

    def __init__(self, directory: Path, fmt: str, kernel_root: Path | None = None, *, create: bool = True,
                 kernels: Path | None = None):
        """`create=False`: a view for reading (the `vgc cache` commands), which creates and repairs nothing.
        `kernels`: where Inductor sees the root's kernel files, when not in `kernel_root` (a private directory that
        links them, for a root that cannot be written); their recorded hashes are checked there."""
        self.directory = Path(directory)
        self.format = fmt
        self.kernel_root = kernel_root   # the root whose inductor_cache/ holds the kernels, when vgc put them there
        self.kernels = kernels if kernels is not None or kernel_root is None else kernel_root / recovery.INDUCTOR_SUBDIR
        self.saving = create
        self._kernels_checked = False
        self._foreign_index = ""   # "found": read_index left out records written for another entry; "counted"
        if create:
            self._repair_layout()
            make_private_dirs(self.directory / ARTIFACT_DIR)
            make_private_dirs(self.directory / LOCK_DIR)

    def _repair_layout(self) -> None:
        """Remove what stands where vgc's own directories and lock files go (a file where `locks/` goes, a looping
        symlink, a directory where a lock file goes): left there, they would fail every later start the same way."""
        suspects = [self.directory / ARTIFACT_DIR, self.directory / LOCK_DIR]
        locks = self.directory / LOCK_DIR
        if locks.is_dir() and not locks.is_symlink():
            suspects += [p for p in locks.iterdir() if p.is_symlink() or not p.is_file()]
        for path in suspects:
            is_lock = path.parent == locks
            if not (path.is_symlink() or (path.exists() and path.is_dir() == is_lock)):
                continue
            what = "symlink" if path.is_symlink() else ("directory" if is_lock else "file")
            self._remove(path)
            warn_once(f"layout:{path}", "cache: removed %s (a %s where vgc keeps its %s)", path, what,
                      "lock file" if is_lock else "directory")

    # ---- small files ----
    def write_text(self, name: str, text: str) -> Path:
        path = self.directory / name
        atomic_write(path, text.encode())
        return path

    def write_factors(self, factors: dict[str, Any]) -> None:
        """Written once per entry, and again when the stored copy is damaged (`vgc cache why-miss` and `ls` read
        it; the start itself never needs it)."""
        path = self.directory / FACTORS_FILE
        if path.exists() or path.is_symlink():
            try:
                if factors_problem(json_data.loads(path.read_bytes()), factors["hash"]) is None:
                    return
            except (OSError, ValueError):
                pass
            warn_once(f"factors:{path}", "cache: %s is damaged; writing it again", path)
            self._remove(path)
        self.write_text(FACTORS_FILE, json.dumps(factors, indent=2, sort_keys=True) + "\n")

    # ---- index ----
    def _index_lock(self) -> FileLock:
        return FileLock(str(self.directory / LOCK_DIR / "index.lock"))

    def read_index(self) -> dict[str, Any]:
        """The index's well-formed records written for this entry and rank; anything unreadable or malformed is
        left out, with one warning, and so are records written for another entry (an index copied or swapped in),
        with one warning for the index: those artifacts are misses, and each save writes the index again without
        them."""
        path = self.directory / INDEX_FILE
        try:
            if not path.exists():
                return {}
            index = json_data.loads(path.read_bytes(), what=str(path))
        except (OSError, ValueError) as e:
            warn_once(f"index:{path}", "cache index %s is unreadable (%s); its artifacts count as misses", path,
                      _describe(e))
            return {}
        if not isinstance(index, dict):
            warn_once(f"index:{path}", "cache index %s is not a JSON object; its artifacts count as misses", path)
            return {}
        binding = index_binding(self.directory)
        elsewhere = bound_elsewhere(index, binding)
        if elsewhere:
            self._foreign_index = self._foreign_index or "found"
            warn_once(f"index:{path}", "cache index %s was written for %s, not for %s (copied or swapped in from "
                      "another entry); its records there are left out: those artifacts are compiled again and the "
                      "index is written again without them", path, ", ".join(elsewhere[:2]), binding)
        good = {}
        for name, record in index.items():
            problem = record_problem(record)
            if problem is None:
                if record.get(BINDING, binding) == binding:
                    good[name] = record
            else:
                warn_once(f"record:{path}:{name}", "cache index %s: record %r is malformed (%s); a miss", path, name,
                          problem)
        return good

    def _update_index(self, name: str, record: dict[str, Any] | None) -> None:
        with self._locked(self._index_lock()):
            index = self.read_index()
            if record is None:
                index.pop(name, None)
            else:
                index[name] = record
            atomic_write(self.directory / INDEX_FILE, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())

    # ---- artifacts ----
    def artifact_lock(self, name: str) -> FileLock:
        """Held while one process compiles `name`, so that others wait and then load instead of compiling."""
        return FileLock(str(self.directory / LOCK_DIR / f"{name}.lock"))

    def artifact_path(self, name: str) -> Path:
        suffix = ".bin" if self.format == "binary" else ""
        return self.directory / ARTIFACT_DIR / f"{name}{suffix}"

    def verify(self, name: str, record: dict[str, Any]) -> str | None:
        """None if the artifact matches its recorded content hash, else what is wrong (never raises)."""
        problem = record_problem(record)
        if problem is not None:
            return f"malformed index record: {problem}"
        try:
            return self._verify(self.directory / ARTIFACT_DIR / record["file"], record)
        except OSError as e:
            return f"unreadable ({_describe(e)})"

    @staticmethod
    def _verify(path: Path, record: dict[str, Any]) -> str | None:
        if not path.exists():
            return "missing"
        if record["format"] == "binary":
            if path.stat().st_size != record["bytes"]:
                return f"size {path.stat().st_size} != {record['bytes']} recorded in {INDEX_FILE}"
            if content_hash(path) != record["sha256"]:
                # which of the two changed cannot be told: a swapped index makes intact artifacts fail too
                return f"content hash differs from the one recorded in {INDEX_FILE} (the file or the index changed)"
            return None
        current = _unpacked_manifest(path)
        for rel, digest in record["files"].items():
            if current.get(rel) != digest:
                return f"file {rel} missing or changed"
        return None

    def load(self, name: str) -> Fetched | None:
        """The loaded artifact; None when there is none (a miss); an empty `Fetched` counting `cache_corrupt` when
        the stored copy was unusable. An unusable copy stays until a good one replaces it (`save`): a load can fail
        for reasons outside the file (a damaged kernel in Inductor's cache), and a good artifact is never lost."""
        damaged = self._check_kernels()
        fetched = self._load(name)
        if self._foreign_index == "found":   # the index's damage, counted once, with the first fetch after it
            self._foreign_index = "counted"
            damaged += 1
        if damaged:   # counted with this artifact's fetch, found or not
            fetched = Fetched(None, {}) if fetched is None else fetched
            fetched = Fetched(fetched.artifact, {**fetched.counts,
                                                 "cache_corrupt": fetched.counts.get("cache_corrupt", 0) + damaged})
        if fetched is not None and fetched.artifact is not None and self.saving and self.kernel_root is not None \
                and kernel_hashes.rebuilt_since_recorded():
            self._record_kernels()   # the files Inductor built again in place of the removed ones
        return fetched

    def _check_kernels(self) -> int:
        """Once per store, before its first artifact loads: the recorded kernel files that were swapped or altered,
        removed (`kernel_hashes.check`); how many."""
        if self._kernels_checked or self.kernels is None:
            return 0
        self._kernels_checked = True
        if self.saving and self.kernel_root is not None:
            # C++ kernels are built when first run, after the loads: what this process built (again) is recorded
            # when it ends
            atexit.register(self._record_kernels_at_exit)
        parents = self.directory.parents   # <root>/torch_compile_cache/<entry>/<rank>
        return kernel_hashes.check(parents[2] if len(parents) > 2 else self.directory, self.kernels)

    def _record_kernels_at_exit(self) -> None:
        if self.saving and self.kernel_root is not None:
            with contextlib.suppress(Exception):   # an exiting process reports nothing more
                self._record_kernels()

    def _record_kernels(self) -> None:
        try:
            with self._locked(self._index_lock()):
                kernel_hashes.update(self.directory, self.kernel_root / recovery.INDUCTOR_SUBDIR)
        except OSError as e:   # the artifacts are saved; their kernels go unchecked until a later save records them
            warn_once(f"kernels:{self.directory}", "cache: cannot record kernel hashes under %s (%s)", self.directory,
                      _describe(e))

    def _load(self, name: str) -> Fetched | None:
        record = self.read_index().get(name)
        if record is None and not os.path.lexists(self.directory / INDEX_FILE) and \
                os.path.lexists(self.artifact_path(name)):
            # the artifact is there, but nothing it could be checked against: name the index, not the artifact
            warn_once(f"index:{self.directory / INDEX_FILE}", "cache index %s is missing, so the artifacts stored "
                      "beside it cannot be checked; they are compiled again", self.directory / INDEX_FILE)
        if record is None or record.get("format") != self.format:
            return None
        problem = self.verify(name, record)
        path = self.directory / ARTIFACT_DIR / record["file"]
        if problem is None:
            start = time.perf_counter()
            try:
                artifact = self._load_artifact(path, _extern_kernels(record))
            except Exception as e:  # e.g. a different torch build: the file asserts its build key
                unwritable = _unwritable_disk_in(e)
                if unwritable is None:
                    problem = f"load failed: {type(e).__name__}: {e}"
                elif self.kernel_root is not None:
                    # a full disk is not damage: Inductor's cache moves off it (one warning), and the intact
                    # artifact loads from there (once more only: kernel_root is None now)
                    self._move_kernels_off(unwritable)
                    return self._load(name)
                else:   # the user's TORCHINDUCTOR_CACHE_DIR cannot be written: the disk's problem, not the file's
                    self.saving = False
                    warn_once(f"artifact:{path}", "cache artifact %s could not be loaded: Inductor's cache cannot be "
                              "written (%s); compiling it in memory", path, unwritable)
                    return None
            else:
                logger.debug("loaded %s in %.3f s", path, time.perf_counter() - start)
                return Fetched(artifact, {"artifacts_loaded": 1})
        warn_once(f"artifact:{path}", "cache artifact %s is unusable (%s); compiling it again", path, problem)
        return Fetched(None, {"cache_corrupt": 1})

    def _move_kernels_off(self, why: str) -> None:
        """Inductor's cache leaves the root that refused its write (`recovery.move_kernel_cache_off`); vgc saves
        nothing more there either: the same disk would refuse it."""
        self.kernels = Path(recovery.move_kernel_cache_off(self.kernel_root, why))
        self.kernel_root = None
        self.saving = False

    def _load_artifact(self, path: Path, extern_kernels: list[str] | None) -> Any:
        """Load a checked artifact; once more after removing the kernel files a failed load named (a 0-byte `.so`
        left by a killed compile), so that a damaged kernel costs a rebuild of that kernel, not a recompile."""
        with headers_remembered():
            try:
                return _compat.load_artifact(str(path), self.format, extern_kernels)
            except Exception as error:
                if self.kernel_root is None or not recovery.remove_suspects(error, self.kernel_root):
                    raise
            return _compat.load_artifact(str(path), self.format, extern_kernels)

    def save(self, name: str, artifact: Any, meta: dict[str, Any]) -> None:
        path = self.artifact_path(name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._remove(tmp)
        _compat.save_artifact(artifact, str(tmp), self.format)
        if self.format == "binary":
            record = {"bytes": tmp.stat().st_size, "sha256": content_hash(tmp)}
        else:
            record = {"files": _unpacked_manifest(tmp)}
        if path.is_dir() and not path.is_symlink():   # os.replace cannot replace a non-empty directory
            old = path.with_name(f".{path.name}.{os.getpid()}.old")
            self._remove(old)
            os.replace(path, old)
            os.replace(tmp, path)
            self._remove(old)
        else:
            os.replace(tmp, path)  # a directory rename is atomic too: readers never see half an unpacked dir
        record.update(meta, file=path.name, format=self.format, created=time.time(),
                      extern_kernels=_compat.torch_extern_kernels())
        record[BINDING] = index_binding(self.directory)
        self._update_index(name, record)
        if self.kernel_root is not None:   # the kernels this artifact's compile built are under the root now
            self._record_kernels()

    @staticmethod
    def _remove(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_symlink() or path.exists():
            path.unlink()

    @contextlib.contextmanager
    def _locked(self, lock: FileLock):
        """`lock` held, or none when it cannot be taken (an unwritable `locks/`): two processes may then both
        compile an artifact or write the index, which costs time, never correctness (writes are atomic)."""
        try:
            lock.acquire()
        except OSError as e:
            warn_once(f"lock:{self.directory}", "cache lock %s cannot be taken (%s); compiling without it",
                      lock.lock_file, _describe(e))
            yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.release()

    def load_or_compile(self, name: str, compile_fn: Callable[[], Any], meta: dict[str, Any]) -> Fetched:
        # a store that saves nothing (an unwritable root) takes no lock: nobody writes there, and it could not
        # create the lock file
        with self._locked(self.artifact_lock(name)) if self.saving else contextlib.nullcontext():
            loaded = self.load(name)
            if loaded is not None and loaded.artifact is not None:
                return Fetched(loaded.artifact, {**loaded.counts, "cache_hits": 1})
            counts = {**(loaded.counts if loaded is not None else {}), "cache_misses": 1, "inductor_compiles": 1}
            artifact = self._compile(compile_fn)
            if self.saving:
                self._save_or_warn(name, artifact, meta, counts)
            return Fetched(artifact, counts)

    def _compile(self, compile_fn: Callable[[], Any]) -> Any:
        """`compile_fn()`; when it fails and Inductor's cache is under vgc's root, the cache is repaired (damaged
        or named files removed; emptied when nothing explains the failure; moved off a full or read-only disk)
        and the compile runs once more. A model that cannot compile still fails, with its own error."""
        try:
            return compile_fn()
        except Exception as error:
            if self.kernel_root is None:
                raise
            unwritable = _unwritable_disk_in(error)
            if unwritable is not None:
                self._move_kernels_off(unwritable)
            elif not recovery.remove_suspects(error, self.kernel_root):
                if not recovery.raised_reading_a_cache(error):
                    raise
                recovery.reset_kernel_cache(self.kernel_root, error)
            return compile_fn()

    def _save_or_warn(self, name: str, artifact: Any, meta: dict[str, Any], counts: dict[str, int]) -> None:
        try:
            self.save(name, artifact, meta)
        except Exception as e:  # an unsaveable graph still runs; it is compiled again next time
            if isinstance(e, OSError) and e.errno in _UNWRITABLE:
                self.saving = False   # a full or read-only disk stays so: stop trying for this entry
                warn_once(f"save:{self.directory}", "cache: cannot write under %s (%s); running without saving",
                          self.directory, _describe(e))
            else:
                warn_once(f"save:{self.directory}:{name}", "could not save artifact %s (%s)", name, _describe(e))
        else:
            counts["artifacts_saved"] = 1


def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind `error` (Inductor and Dynamo wrap what they raise), or None."""
    return next((link for link in recovery.error_chain(error) if isinstance(link, OSError)), None)


# What a compiler or linker prints when it cannot write its output: gcc reports a full disk as text in a
# CppCompileError, not as an OSError.
_UNWRITABLE_TEXT = tuple(os.strerror(code) for code in _UNWRITABLE if code not in (errno.EACCES, errno.EPERM))


def _unwritable_disk_in(error: BaseException) -> str | None:
    """Why the disk under the kernel cache cannot take a compile's output (a full disk, a quota, a read-only
    file system), as an OSError or a subprocess's message behind `error`; None when nothing says so."""
    cause = _os_error_in(error)
    if isinstance(cause, OSError) and cause.errno in _UNWRITABLE:
        return _describe(cause)
    for link in recovery.error_chain(error):
        text = str(link)
        found = next((reason for reason in _UNWRITABLE_TEXT if reason in text), None)
        if found is not None:
            return f"{found} (in a {type(link).__name__})"
    return None


class NoStore:
    """Used when the cache is disabled: compiles every time, reads and writes nothing."""

    directory = None
    saving = False

    def load(self, name: str) -> Fetched | None:
        return None

    def write_text(self, name: str, text: str) -> None:
        return None

    def write_factors(self, factors: dict[str, Any]) -> None:
        return None

    def load_or_compile(self, name: str, compile_fn: Callable[[], Any], meta: dict[str, Any]) -> Fetched:
        return Fetched(compile_fn(), {"inductor_compiles": 1})
