"""`vgc cache verify`: everything under a cache root that a start would trip over, found without running anything
and without changing anything."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgc.cache import json_data, kernel_hashes, recovery, saved_traces
from vgc.cache.inventory import _read_only_store, Entry
from vgc.cache.layout import (ARTIFACT_DIR, CACHE_SUBDIR, FACTORS_FILE, INDEX_FILE, LOCK_DIR, saved_trace_files_in,
                              untrusted_reason)
from vgc.cache.store import BINDING, bound_elsewhere, factors_problem, index_binding, record_problem


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
    (as `layout.untrusted_reason` judges it at a start); per rank directory its `index.json` (readable, a JSON
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
    root = entry.path.parent.parent
    for path, problem in kernel_hashes.mismatches(root, root / recovery.INDUCTOR_SUBDIR, once=False, only=[rank_dir]):
        bad = (path, f"{problem}; a start removes it and Inductor builds it again")
        if bad not in report.bad:   # a kernel two entries record is named once
            report.bad.append(bad)
    _check_locks(rank_dir / LOCK_DIR, report)
    for trace in saved_trace_files_in(rank_dir):
        problem = saved_traces.problem(trace)
        if problem:
            report.bad.append((trace, f"{problem}; a start warns and traces again"))
    # computation_graph*.py and transformed_code.py are rewritten by every start: nothing to check.


def _check_index(path: Path, report: Verification) -> dict[str, Any] | None:
    """The index's records as stored (well-formed or not) that were written for this rank directory, None when the
    index is unusable as a whole or none of it is this rank's; each problem a start would warn about is bad."""
    if not os.path.lexists(path):
        return {}   # no artifact saved yet: every artifact is a miss anyway
    try:
        index = json_data.loads(path.read_bytes(), what=str(path))
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
    binding = index_binding(path.parent)
    elsewhere = bound_elsewhere(index, binding)
    if elsewhere:
        report.bad.append((path, f"written for {', '.join(elsewhere[:2])}, not for {binding} (copied or swapped in "
                                 "from another entry); a start leaves those records out and compiles their "
                                 "artifacts again"))
        index = {name: r for name, r in index.items() if not isinstance(r, dict) or r.get(BINDING, binding) == binding}
        if not index:
            return None   # nothing of this rank's: its artifacts are not "unindexed", the index is bad
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
        manifest = json_data.loads(path.read_bytes(), what=str(path))
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
