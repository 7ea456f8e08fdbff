"""Content hashes of the files in Inductor's cache under a root (compiled `.so` kernels, generated `.py` and `.cpp`
code, Triton's files), recorded in each rank directory of an entry when it saves an artifact and checked once per
file and process before its artifacts load; `vgc cache verify` and `unpack` check them too.

Inductor names these files by a hash of their source, not of their bytes, and loads them without a check: two
`.so` files swapped load the wrong kernel (an argument-count error, or a heap corrupted without a word), and two
generated `.py` files swapped run the wrong code. A file whose bytes differ from the record is removed (Inductor
builds it again from the artifact it belongs to), counted in `cache_corrupt` and warned about once. A file the
record does not name (built after the entry's last save) is not checked; a missing one is built again.

A record only says what bytes a file had when it was written: records recomputed over swapped files (a tool that
rewrites them, a forged bundle) would pass swapped generated modules. Those are named by their source, so a
generated `.py` is also checked against its own name, Inductor's hash of the code it holds, unless the record says
its name is not that hash (a module written under an extra key, such as an autotuning benchmark).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from vgc import _compat
from vgc.cache import json_data
from vgc.cache.cpu_isa import MARKER_DIR as ISA_MARKER_DIR
from vgc.cache.layout import atomic_write, CACHE_SUBDIR
from vgc.log import warn_once

logger = logging.getLogger("vgc")

RECORD_FILE = "kernels.json"   # in a rank directory: {path under inductor_cache/: sha256[ FREE_NAME]}
FREE_NAME = " free-name"       # after a module's hash: its name is not its source's hash (not checked against it)
# Not recorded: Inductor's FX-graph and AOTAutograd pickles (vgc's binary artifacts carry their own graph and do
# not read them; a load rewrites them), locks, vgc's ISA probe records, temporary and hidden files.
_UNTRACKED_DIRS = {"fxgraph", "aotautograd", "locks", ISA_MARKER_DIR}

_seen: dict[str, str] = {}     # file -> the sha256 this process found it to have: each file is hashed once
_rebuilt: set[str] = set()     # files this process removed: the bytes Inductor writes there next are its own


# Files Inductor rewrites in place, whose bytes no record can hold: Triton's autotuning results (`.best_config`,
# updated as more sizes are tuned; a warm root on an H100 had all four rewritten after they were recorded, so
# every start removed them and tuned again).
_REWRITTEN = (".best_config",)


def tracked(relative: str) -> bool:
    parts = relative.split("/")
    if parts[0] in _UNTRACKED_DIRS or any(p.startswith(".") for p in parts) or relative.endswith((".lock", ".tmp")) \
            or ".vgc-loads-" in relative or relative.endswith(_REWRITTEN):
        return False
    # Inductor's CPU capability probes (`c<hash>.so` and `.cpp` beside the kernels' `c<hash>.main.so`): every start
    # that lacks one builds it, with other bytes, before any artifact loads; no artifact loads them
    return parts[0] == "triton" or not parts[-1].endswith((".so", ".cpp")) or ".main." in parts[-1]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def named_module(relative: str) -> bool:
    """A generated module where `PyCodeCache.write` puts one: `<name[1:3]>/<name>.py`."""
    parts = relative.split("/")
    return len(parts) == 2 and parts[1].endswith(".py") and parts[0] == parts[1][1:3]


def holds_its_name(relative: str, data: bytes) -> bool | None:
    """Whether the generated module at `relative` with bytes `data` holds the code its name is the hash of (None:
    this torch cannot tell)."""
    try:
        name = _compat.inductor_code_name(data.decode("utf-8"))
    except UnicodeDecodeError:
        return False
    return None if name is None else name == relative.rpartition("/")[2][:-len(".py")]


def _hashes(path: Path, relative: str) -> tuple[str, bool | None]:
    """(the file's sha256, whether it holds the code its name says: None unless it is a generated module and this
    torch can tell), from one read of the file; raises OSError."""
    if not named_module(relative):
        return _sha256(path), None
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), holds_its_name(relative, data)


def free_name(value: str) -> bool:
    """Whether a record's value says the module's name is not its source's hash."""
    return value.endswith(FREE_NAME)


def digest(value: str) -> str:
    return value.split(" ", 1)[0]


def read_record(rank_dir: Path) -> dict[str, str] | None:
    """The rank directory's record; {} when there is none yet, None when it is unreadable or malformed."""
    path = rank_dir / RECORD_FILE
    if not os.path.lexists(path):
        return {}
    try:
        record = json_data.loads(path.read_bytes(), what=str(path))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in record.items()):
        return None
    return record


def rank_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (Path(root) / CACHE_SUBDIR).glob("*/rank_*") if p.is_dir())


def mismatches(root: Path, kernels: Path, once: bool = True, only: list[Path] | None = None,
               missing: list[Path] | None = None) -> list[tuple[Path, str]]:
    """(file, why) for each file under `kernels` that a record in the root names and whose bytes match none of the
    hashes the root's records hold for it (entries share kernels, and each records the bytes it saw); missing files
    are not listed (Inductor builds them; appended to `missing` when given), an unreadable record is. `only`: the
    rank directories whose records name the files to check (default: all). `once`: a file this process found
    intact before is not hashed again (a start); `vgc cache verify` hashes every file."""
    found, known, checked = [], {}, set()
    for rank_dir in rank_dirs(root):
        record = read_record(rank_dir)
        if record is None:
            if only is None or rank_dir in only:
                found.append((rank_dir / RECORD_FILE, "unreadable or malformed: Inductor's files cannot be checked "
                                                      "against it"))
            continue
        record = {relative: value for relative, value in record.items() if tracked(relative)}   # older records
        for relative, value in record.items():
            known.setdefault(relative, set()).add(value)
        if only is None or rank_dir in only:
            checked.update(record)
    for relative in sorted(checked):
        path, values = kernels / relative, known[relative]
        digests = {digest(v) for v in values}
        if once and _seen.get(str(path)) in digests:
            continue
        try:
            if not path.is_file():
                if missing is not None and not os.path.lexists(path):
                    missing.append(path)
                continue   # missing (built again), or a directory (recovery's business)
            actual, named = _hashes(path, relative)
        except OSError:
            continue       # unreadable: recovery's business
        if actual in digests and named is False and not any(free_name(v) for v in values):
            found.append((path, "holds other code than its name says (Inductor names a generated module by a hash of "
                                "its source; swapped with another kernel, with its content hash recorded over it)"))
        elif actual in digests:
            _seen[str(path)] = actual
        else:
            found.append((path, f"does not match the content hash recorded for it under {root} (swapped with "
                                "another kernel or altered)"))
    return found


def check(root: Path, kernels: Path) -> int:
    """Remove each file under `kernels` (Inductor's cache as this process sees it) whose bytes match none of the
    root's records for it, with one warning each; returns how many were removed. Every entry's records count: a
    new entry's compile finds the kernels other entries built, by name, and would load a swapped one too.

    A recorded file that is missing (a bundle packed without kernels, an emptied Inductor cache) is built again
    here, and a C++ build elsewhere (another directory, another machine) need not give the recorded bytes: its
    record is dropped as for a removed file, so the bytes built here are recorded instead of removed by the next
    start."""
    missing = []
    found = mismatches(root, kernels, missing=missing)
    gone = list(missing)   # every record naming these is dropped once, below
    for path, problem in found:
        if path.name == RECORD_FILE:
            warn_once(f"kernels:{path}", "cache: %s is %s; its next save writes it again", path, problem)
            continue
        try:
            path.unlink()
        except OSError as e:
            warn_once(f"kernel:{path}", "cache: %s %s, and cannot be removed (%s)", path, problem, e.strerror or e)
            continue
        gone.append(path)
        warn_once(f"kernel:{path}", "cache: %s %s; removed it, Inductor builds it again", path, problem)
    if gone:
        _rebuilt.update(str(path) for path in gone)
        forget(root, kernels, *gone)
    removed = len(gone) - len(missing)
    if removed:
        _compat.clear_inductor_memory_caches()   # a module or library loaded from the removed file must not be reused
    return removed


def forget(root: Path, kernels: Path, *paths: Path) -> None:
    """Drop `paths` from every record under `root` that names them, once they have been removed: the bytes Inductor
    builds there next are its own, recorded at the next save. Without this, a process that never saves (or is
    killed, or builds a C++ kernel lazily after its last save) leaves the next start a rebuilt file to remove
    again."""
    relative = set()
    for path in paths:
        try:
            relative.add(Path(path).relative_to(kernels).as_posix())
        except ValueError:
            continue
    for rank_dir in rank_dirs(root):
        record = read_record(rank_dir)
        if record and relative & set(record):
            for name in relative & set(record):
                del record[name]
            try:
                atomic_write(rank_dir / RECORD_FILE, (json.dumps(record, indent=0, sort_keys=True) + "\n").encode())
            except OSError:
                pass   # a root that cannot be written: the next start removes the rebuilt file again, nothing worse


def rebuilt_since_recorded() -> bool:
    return bool(_rebuilt)


def update(rank_dir: Path, kernels: Path) -> None:
    """Record the files under `kernels` that the record does not name yet, and those this process removed and
    Inductor built again (their new bytes are Inductor's own)."""
    record = read_record(rank_dir) or {}
    changed = False
    for directory, dirnames, filenames in os.walk(kernels):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(directory, d))]
        for name in filenames:
            path = Path(directory, name)
            relative = path.relative_to(kernels).as_posix()
            if not tracked(relative) or (relative in record and str(path) not in _rebuilt) or path.is_symlink():
                continue
            try:
                actual, named = _hashes(path, relative)
            except OSError:
                continue
            _seen[str(path)] = actual
            record[relative] = actual + (FREE_NAME if named is False else "")
            _rebuilt.discard(str(path))
            changed = True
    if changed:
        atomic_write(rank_dir / RECORD_FILE, (json.dumps(record, indent=0, sort_keys=True) + "\n").encode())
