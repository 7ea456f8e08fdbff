"""The on-disk artifact store of one cache entry: atomic writes, per-artifact locks, an index of content hashes.

Artifacts are executable code (Inductor output is imported and run): only use a cache directory you trust.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

from vgc import _compat

logger = logging.getLogger("vgc")

INDEX_FILE = "index.json"
FACTORS_FILE = "cache_key_factors.json"
ARTIFACT_DIR = "artifacts"


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


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


class ArtifactStore:
    """Artifacts of one cache entry (`.../torch_compile_cache/<hash>/rank_<r>_<dp>/`)."""

    def __init__(self, directory: Path, fmt: str):
        self.directory = Path(directory)
        self.format = fmt
        make_private_dirs(self.directory / ARTIFACT_DIR)
        make_private_dirs(self.directory / "locks")

    # ---- small files ----
    def write_text(self, name: str, text: str) -> Path:
        path = self.directory / name
        atomic_write(path, text.encode())
        return path

    def write_factors(self, factors: dict[str, Any]) -> None:
        path = self.directory / FACTORS_FILE
        if not path.exists():
            self.write_text(FACTORS_FILE, json.dumps(factors, indent=2, sort_keys=True) + "\n")

    # ---- index ----
    def _index_lock(self) -> FileLock:
        return FileLock(str(self.directory / "locks" / "index.lock"))

    def read_index(self) -> dict[str, Any]:
        path = self.directory / INDEX_FILE
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            logger.warning("cache index %s is unreadable (%s); treating the entry as empty", path, e)
            return {}

    def _update_index(self, name: str, record: dict[str, Any] | None) -> None:
        with self._index_lock():
            index = self.read_index()
            if record is None:
                index.pop(name, None)
            else:
                index[name] = record
            atomic_write(self.directory / INDEX_FILE, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())

    # ---- artifacts ----
    def artifact_lock(self, name: str) -> FileLock:
        """Held while one process compiles `name`, so that others wait and then load instead of compiling."""
        return FileLock(str(self.directory / "locks" / f"{name}.lock"))

    def artifact_path(self, name: str) -> Path:
        suffix = ".bin" if self.format == "binary" else ""
        return self.directory / ARTIFACT_DIR / f"{name}{suffix}"

    def verify(self, name: str, record: dict[str, Any]) -> str | None:
        """None if the artifact matches its recorded content hash, else what is wrong."""
        path = self.directory / ARTIFACT_DIR / record["file"]
        if not path.exists():
            return "missing"
        if record["format"] == "binary":
            if path.stat().st_size != record["bytes"]:
                return f"size {path.stat().st_size} != recorded {record['bytes']}"
            if content_hash(path) != record["sha256"]:
                return "content hash mismatch"
            return None
        current = _unpacked_manifest(path)
        for rel, digest in record["files"].items():
            if current.get(rel) != digest:
                return f"file {rel} missing or changed"
        return None

    def load(self, name: str) -> Fetched | None:
        """The loaded artifact; None when there is none (a miss); an empty `Fetched` counting `cache_corrupt` when
        the stored copy was unusable, which is logged and removed."""
        record = self.read_index().get(name)
        if record is None or record.get("format") != self.format:
            return None
        problem = self.verify(name, record)
        path = self.directory / ARTIFACT_DIR / record["file"]
        if problem is None:
            start = time.perf_counter()
            try:
                artifact = _compat.load_artifact(str(path), self.format)
            except Exception as e:  # e.g. a different torch build: the file asserts its build key
                problem = f"load failed: {type(e).__name__}: {e}"
            else:
                logger.debug("loaded %s in %.3f s", path, time.perf_counter() - start)
                return Fetched(artifact, {"artifacts_loaded": 1})
        logger.warning("cache artifact %s is unusable (%s); recompiling it", path, problem)
        self._remove(path)
        self._update_index(name, None)
        return Fetched(None, {"cache_corrupt": 1})

    def save(self, name: str, artifact: Any, meta: dict[str, Any]) -> None:
        path = self.artifact_path(name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._remove(tmp)
        _compat.save_artifact(artifact, str(tmp), self.format)
        if self.format == "binary":
            record = {"bytes": tmp.stat().st_size, "sha256": content_hash(tmp)}
        else:
            record = {"files": _unpacked_manifest(tmp)}
        self._remove(path)
        os.replace(tmp, path)  # a directory rename is atomic too: readers never see half an unpacked dir
        record.update(meta, file=path.name, format=self.format, created=time.time())
        self._update_index(name, record)

    @staticmethod
    def _remove(path: Path) -> None:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()

    def load_or_compile(self, name: str, compile_fn: Callable[[], Any], meta: dict[str, Any]) -> Fetched:
        with self.artifact_lock(name):
            loaded = self.load(name)
            if loaded is not None and loaded.artifact is not None:
                return Fetched(loaded.artifact, {**loaded.counts, "cache_hits": 1})
            counts = {**(loaded.counts if loaded is not None else {}), "cache_misses": 1, "inductor_compiles": 1}
            artifact = compile_fn()
            try:
                self.save(name, artifact, meta)
            except Exception as e:  # an unsaveable graph still runs; it is compiled again next time
                logger.warning("could not save artifact %s (%s: %s)", name, type(e).__name__, e)
            else:
                counts["artifacts_saved"] = 1
            return Fetched(artifact, counts)


class NoStore:
    """Used when the cache is disabled: compiles every time, reads and writes nothing."""

    directory = None

    def write_text(self, name: str, text: str) -> None:
        return None

    def write_factors(self, factors: dict[str, Any]) -> None:
        return None

    def load_or_compile(self, name: str, compile_fn: Callable[[], Any], meta: dict[str, Any]) -> Fetched:
        return Fetched(compile_fn(), {"inductor_compiles": 1})
