"""Reading a cache root: its entries, their manifests and artifacts, what tells entries apart; verify, prune and
explain misses."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vgc.cache import recovery
from vgc.cache.keys import diff_factors, flatten_factors
from vgc.cache.store import ARTIFACT_DIR, FACTORS_FILE, INDEX_FILE, ArtifactStore, factors_problem, record_problem

CACHE_SUBDIR = "torch_compile_cache"
LOCK_DIR = "locks"


def _read_only_store(directory: Path, fmt: str) -> ArtifactStore:
    """An `ArtifactStore` for reading only: it creates or repairs nothing, so `ls`, `show` and `verify` leave a
    root as they found it (and work on a read-only copy)."""
    return ArtifactStore(directory, fmt, create=False)


@dataclass
class Entry:
    """One `<root>/torch_compile_cache/<hash>/` directory."""
    path: Path

    @property
    def hash(self) -> str:
        return self.path.name

    def rank_dirs(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if p.is_dir() and p.name.startswith("rank_"))

    def manifest(self) -> dict[str, Any] | None:
        """The entry's `cache_key_factors.json`, or None if it is missing, unreadable or not a JSON object. A start
        reads other entries' manifests to explain a miss, so a damaged one must not raise."""
        for rank_dir in self.rank_dirs():
            path = rank_dir / FACTORS_FILE
            if path.exists():
                try:
                    manifest = json.loads(path.read_text())
                except (OSError, ValueError):
                    return None
                return manifest if isinstance(manifest, dict) else None
        return None

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def last_used(self) -> float:
        times = [p.stat().st_mtime for p in self.path.rglob("*") if p.is_file()]
        return max(times, default=self.path.stat().st_mtime)

    def remove(self) -> None:
        """Delete the entry without taking its locks: a process writing to it at the same time loses its work."""
        shutil.rmtree(self.path, ignore_errors=True)

    def stores(self) -> Iterator[ArtifactStore]:
        """A read-only store per rank directory, in the format of its first well-formed index record."""
        for rank_dir in self.rank_dirs():
            store = _read_only_store(rank_dir, "binary")
            store.format = next((r["format"] for r in store.read_index().values()), "binary")
            yield store


def saved_trace_files(entry: Entry) -> list[Path]:
    """The saved Dynamo traces (`vgc.compile`'s warm starts) of every rank of an entry."""
    return sorted(p for rank_dir in entry.rank_dirs() for p in saved_trace_files_in(rank_dir))


def saved_trace_files_in(rank_dir: Path) -> list[Path]:
    from vgc.cache.saved_traces import PREFIX, SUFFIX   # it imports entry.py, which imports this module

    return sorted(rank_dir.glob(f"{PREFIX}*{SUFFIX}"))


def entries(root: Path) -> list[Entry]:
    base = Path(root) / CACHE_SUBDIR
    if not base.is_dir():
        return []
    return sorted((Entry(p) for p in base.iterdir() if p.is_dir()), key=lambda e: e.last_used(), reverse=True)


def find_entry(root: Path, prefix: str) -> Entry:
    """The one entry whose hash starts with `prefix`; a `LookupError` naming the prefix and the candidates if
    there is no such entry or several."""
    found = entries(root)
    matches = [e for e in found if e.hash.startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    base = Path(root) / CACHE_SUBDIR
    if matches:
        raise LookupError(f"{prefix!r} matches {len(matches)} entries under {base}: {_hash_list(matches)}; "
                          "give more digits")
    if not found:
        raise LookupError(f"no entry under {base} matches {prefix!r}: there are no entries; check --root")
    raise LookupError(f"no entry under {base} matches {prefix!r}; the entries are {_hash_list(found)} "
                      "(see `vgc cache ls`)")


def _hash_list(found: list[Entry], limit: int = 8) -> str:
    shown = ", ".join(e.hash for e in found[:limit])
    return shown if len(found) <= limit else f"{shown} and {len(found) - limit} more"


def config_digest(config_factors: dict[str, Any]) -> str:
    """8 hex digits that name an entry's config: the start of `CompilationConfig.compute_hash()` of the config it
    was built with, so a program can find its entries by printing its own config's hash."""
    blob = json.dumps(config_factors, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


ABSENT = object()
"""The value `distinguishing_factors` gives a factor that one entry records and another does not."""


def distinguishing_factors(found: list[Entry]) -> dict[str, dict[str, Any]]:
    """Per entry hash, its key factors (flattened names) whose value is not the same in all the entries: what tells
    entries of one model apart. Entries without readable factors are left out."""
    flat = {}
    for entry in found:
        manifest = entry.manifest()
        if manifest and "factors" in manifest:
            flat[entry.hash] = flatten_factors(manifest["factors"])
    names = sorted(set().union(*flat.values())) if flat else []
    # Values are JSON (lists, dicts): compared by their canonical text, with ABSENT as its own value.
    varying = [n for n in names
               if len({json.dumps(f[n], sort_keys=True) if n in f else None for f in flat.values()}) > 1]
    return {h: {n: f.get(n, ABSENT) for n in varying} for h, f in flat.items()}


class CannotVerify(ValueError):
    """`verify_root` could not check the root at all (it is missing or not a directory)."""


@dataclass
class Verification:
    """What `check_root` found. `bad` holds every (path, problem) that changes what a start does: a miss, a
    recompile, a warning, or the cache switched off. `unindexed` holds files in `artifacts/` that no index record
    names (left by a format change or a killed save): a start ignores them, so they are not bad."""
    bad: list[tuple[Path, str]] = field(default_factory=list)
    unindexed: list[Path] = field(default_factory=list)
    artifacts: int = 0   # index records checked
    entries: int = 0


def verify_root(root: Path) -> list[tuple[Path, str]]:
    """(path, problem) for everything under `root` that a start would trip over; empty for a sound root.

    Checked: the trust of the root, `torch_compile_cache/`, `inductor_cache/`, every entry and rank directory
    (as `entry.untrusted_reason` judges it at a start); per rank directory its `index.json` (readable, a JSON
    object, well-formed records), every indexed artifact against its record (`ArtifactStore.verify`),
    `cache_key_factors.json` (a JSON object with the entry's "hash"), `artifacts/` and `locks/` (directories) and
    every `locks/*.lock` (a regular file, not a symlink: filelock refuses those), every saved trace (whole: its
    header and content hash); and every damaged file under
    `inductor_cache/` (`recovery.kernel_cache_problems`). Debug files and unindexed artifacts are never bad.
    Raises `CannotVerify` when `root` is missing or not a directory; nothing under the root is changed."""
    return check_root(root).bad


def check_root(root: Path) -> Verification:
    """`verify_root` with the counts and the unindexed files that `vgc cache verify` prints."""
    root = Path(root)
    if not root.is_dir():
        if os.path.lexists(root) and not root.exists():
            raise CannotVerify(f"cannot check {root}: it is a dangling or looping symlink")
        raise CannotVerify(f"cannot check {root}: " + ("it is not a directory" if root.exists()
                                                       else "it does not exist; check --root or $VGC_CACHE_ROOT"))
    report = Verification()
    for path in (root, root / CACHE_SUBDIR, root / recovery.INDUCTOR_SUBDIR):
        _check_trust(path, report)
    base = root / CACHE_SUBDIR
    if base.is_dir():
        for child in _listing(base, report):
            if child.is_dir():
                report.entries += 1
                _check_entry(Entry(child), report)
            elif _ENTRY_NAME.fullmatch(child.name):
                # A start whose key is this name would find a non-directory and turn the cache off.
                _check_trust(child, report)
    if (root / recovery.INDUCTOR_SUBDIR).is_dir():   # a missing one is created by a start; a file is untrusted above
        report.bad.extend(recovery.kernel_cache_problems(root, deep=True))
    return report


def verify_entry(entry: Entry) -> list[str]:
    """`"<path>: <problem>"` for each bad path of one entry (the per-entry part of `verify_root`, which
    supersedes it; kept for callers that check a single entry)."""
    report = Verification()
    _check_entry(entry, report)
    return [f"{path}: {problem}" for path, problem in report.bad]


_ENTRY_NAME = re.compile(r"[0-9a-f]{20}")


def _why(error: OSError) -> str:
    return error.strerror or str(error)


def _check_trust(path: Path, report: Verification) -> None:
    from vgc.cache.entry import untrusted_reason   # entry.py imports this module

    reason = untrusted_reason(path)
    if reason:
        report.bad.append((path, f"untrusted: {reason}; a start turns the cache off"))


def _listing(directory: Path, report: Verification) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError as e:
        report.bad.append((directory, f"unreadable directory ({_why(e)})"))
        return []


def _check_entry(entry: Entry, report: Verification) -> None:
    _check_trust(entry.path, report)
    for child in _listing(entry.path, report):
        if child.name.startswith("rank_"):
            _check_trust(child, report)   # a non-directory here is "is not a directory"
            if child.is_dir():
                _check_rank_dir(entry, child, report)


def _check_rank_dir(entry: Entry, rank_dir: Path, report: Verification) -> None:
    raw = _check_index(rank_dir / INDEX_FILE, report)
    records = {name: record for name, record in sorted((raw or {}).items()) if record_problem(record) is None}
    report.artifacts += len(records)
    artifacts = rank_dir / ARTIFACT_DIR
    if os.path.lexists(artifacts) and not artifacts.is_dir():
        report.bad.append((artifacts, "not a directory; a start can neither load nor save artifacts"))
    store = _read_only_store(rank_dir, "binary")   # verify() reads the format from each record
    for name, record in records.items():
        problem = store.verify(name, record)
        if problem:
            report.bad.append((artifacts / record["file"], problem))
    if artifacts.is_dir() and raw is not None:   # with the index unusable, "unindexed" would list every artifact
        named = {r["file"] for r in raw.values() if isinstance(r, dict) and isinstance(r.get("file"), str)}
        unindexed = [p for p in _listing(artifacts, report) if p.name not in named and not p.name.startswith(".")]
        if not os.path.lexists(rank_dir / INDEX_FILE) and unindexed:
            # artifacts without an index: a start cannot find them and compiles everything again
            report.bad.append((rank_dir / INDEX_FILE, f"missing while {len(unindexed)} artifacts are stored; "
                                                      "every artifact of this rank is a miss"))
        else:
            report.unindexed.extend(unindexed)
    _check_factors(entry, rank_dir / FACTORS_FILE, report)
    _check_locks(rank_dir / LOCK_DIR, report)
    from vgc.cache import saved_traces   # it imports entry.py, which imports this module
    for trace in saved_trace_files_in(rank_dir):
        problem = saved_traces.problem(trace)
        if problem:
            report.bad.append((trace, f"{problem}; a start warns and traces again"))
    # computation_graph*.py and transformed_code.py are rewritten by every start: nothing to check.


def _check_index(path: Path, report: Verification) -> dict[str, Any] | None:
    """The index's records as stored (well-formed or not), None when the index is unusable as a whole; each
    problem a start would warn about is bad."""
    if not os.path.lexists(path):
        return {}   # no artifact saved yet: every artifact is a miss anyway
    try:
        index = json.loads(path.read_text())
    except OSError as e:
        report.bad.append((path, f"unreadable ({_why(e)}); every artifact of this rank is a miss"))
        return None
    except ValueError as e:   # UnicodeDecodeError too
        report.bad.append((path, f"not valid JSON ({e}); every artifact of this rank is a miss"))
        return None
    if not isinstance(index, dict):
        report.bad.append((path, f"not a JSON object (a {type(index).__name__}); every artifact of this rank is a "
                                 "miss"))
        return None
    for name, record in sorted(index.items()):
        problem = record_problem(record)
        if problem:
            report.bad.append((path, f"record {name!r} is malformed ({problem}); that artifact is a miss"))
    return index


def _check_factors(entry: Entry, path: Path, report: Verification) -> None:
    # A start rewrites this file when `factors_problem` finds it damaged (with a warning); until then the miss log
    # line of other keys, `ls` and `why-miss` cannot use this entry.
    if not os.path.lexists(path):
        return   # the next start of this entry writes it
    try:
        manifest = json.loads(path.read_text())
    except OSError as e:
        report.bad.append((path, f"unreadable ({_why(e)})"))
        return
    except ValueError as e:
        report.bad.append((path, f"not valid JSON ({e})"))
        return
    problem = factors_problem(manifest, entry.hash)
    if problem:
        report.bad.append((path, problem))


def _check_locks(locks: Path, report: Verification) -> None:
    if not os.path.lexists(locks):
        return   # a start creates it
    if not locks.is_dir():
        report.bad.append((locks, "not a directory; a start cannot take its locks or save"))
        return
    for path in _listing(locks, report):
        if not path.name.endswith(".lock"):
            continue
        # filelock opens with O_NOFOLLOW: any symlink fails, as does anything but a regular file. The content of a
        # lock file is never read, so garbage in it is harmless.
        if path.is_symlink():
            report.bad.append((path, "a symlink; filelock refuses it, so a start cannot take this lock"))
        elif not path.is_file():
            report.bad.append((path, "not a regular file; a start cannot take this lock"))


def closest_entry(root: Path, factors: dict[str, Any]) -> tuple[Entry, list[str]] | None:
    """The entry whose recorded factors differ from `factors` in the fewest places, with those differences."""
    best = None
    for entry in entries(root):
        manifest = entry.manifest()
        if not manifest or "factors" not in manifest:
            continue
        differences = diff_factors(manifest["factors"], factors)
        if best is None or len(differences) < len(best[1]):
            best = (entry, differences)
    return best


def parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = text.strip().lower()
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text) * 86400
    except (ValueError, IndexError):
        raise ValueError(f"--older-than must be a duration like 12h, 7d or 2w, got {text!r}") from None


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("b").rstrip("i")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise ValueError(f"--max-size must be a size like 500M or 2G, got {text!r}") from None


def select_for_prune(root: Path, older_than_s: float | None = None, max_size: int | None = None) -> list[Entry]:
    """What `vgc cache prune` removes: entries unused for `older_than_s`, then least recently used ones until the
    rest fit in `max_size` bytes. Nothing is removed here."""
    selected = []
    now = time.time()
    remaining = entries(root)  # most recently used first
    if older_than_s is not None:
        for entry in list(remaining):
            if now - entry.last_used() > older_than_s:
                selected.append(entry)
                remaining.remove(entry)
    if max_size is not None:
        sizes = {e.hash: e.size_bytes() for e in remaining}
        total = sum(sizes.values())
        while remaining and total > max_size:
            entry = remaining.pop()
            total -= sizes[entry.hash]
            selected.append(entry)
    return selected
