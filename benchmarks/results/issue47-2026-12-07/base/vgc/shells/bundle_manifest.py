"""What a bundle's manifest may say, checked as data before anything uses it: its form, the names of its entries,
ranks and files, and limits on their number, length and depth.

A manifest comes from another machine, so nothing in it is a path until it is known to be one of vgc's: an entry
name is 20 hex digits (never `ab/cd`, `.`, or an absolute path, which `root / name` would put outside the root),
a rank `rank_<r>_<dp>`, a file name a relative path in canonical form under `torch_compile_cache/<a listed entry>/
<a listed rank>/` or `inductor_cache/`, and no file name is a directory of another.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from vgc._version import __version__
from vgc.cache import json_data
from vgc.cache.layout import CACHE_SUBDIR
from vgc.cache.recovery import INDUCTOR_SUBDIR

FORMAT = "vgc-cache-bundle"
VERSION = 1
MAX_BYTES = json_data.MAX_BYTES
MAX_DEPTH = 16            # vgc's manifests nest 6 levels (a config inside an entry's factors)
MAX_ENTRIES = 10_000
MAX_RANKS = 65_536        # per entry: tensor-parallel ranks times data-parallel ranks
MAX_FILES = 1_000_000
MAX_NAME = 1024           # characters in a file name; Inductor's longest paths are about 200
MAX_PARTS = 16            # components of a file name; vgc's deepest (an unpacked artifact's files) has 9
MAX_PART = 255            # bytes in one component, as most file systems allow
MAX_FILE_SIZE = 1 << 40   # bytes in one file
MAX_PROBLEMS = 10         # problems reported; a manifest wrong everywhere is reported by its first few

ENTRY_NAME = re.compile(r"[0-9a-f]{20}")
RANK_NAME = re.compile(r"rank_[0-9]{1,6}_[0-9]{1,6}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def parse(data: bytes) -> Any:
    """The manifest's JSON, bounded (`json_data.loads`): `ValueError` when it is not JSON or past the limits."""
    return json_data.loads(data, max_depth=MAX_DEPTH, max_bytes=MAX_BYTES, what="its manifest")


def file_name_problem(name: Any) -> str | None:
    """Why a file name in a bundle could not be a file of vgc's under a root, or None."""
    if not isinstance(name, str):
        return f"file name {name!r} is not a string"
    if len(name) > MAX_NAME:
        return f"file name {name[:60]!r}... is {len(name)} characters, more than {MAX_NAME}"
    if "\\" in name or "\0" in name:
        return f"file name {name!r} holds a backslash or a NUL"
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in name.split("/") or name.startswith("~"):
        return f"file {name!r} points outside the root"
    if not name or str(path) != name or "." in name.split("/"):   # `a//b`, `a/./b`, `a/`: two names for one file
        return f"file name {name!r} is not in canonical form"
    if len(path.parts) > MAX_PARTS:
        return f"file name {name!r} is {len(path.parts)} directories deep, more than {MAX_PARTS}"
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_PART for part in path.parts):
        return f"file name {name!r} has a component longer than {MAX_PART} bytes"
    if path.parts[0] not in (CACHE_SUBDIR, INDUCTOR_SUBDIR) or len(path.parts) < 2:
        return f"file {name!r} is not under {CACHE_SUBDIR}/ or {INDUCTOR_SUBDIR}/"
    return None


def problems(manifest: Any) -> list[str]:
    """Everything wrong with a parsed manifest's form (at most `MAX_PROBLEMS`); empty when every name in it is one
    of vgc's and every value has its type."""
    if not isinstance(manifest, dict):
        return ["its manifest is not a JSON object"]
    if manifest.get("format") != FORMAT:
        return [f"its manifest's format is {_short(manifest.get('format'))}, not {FORMAT!r}"]
    if manifest.get("version") != VERSION:
        return [f"it is bundle version {_short(manifest.get('version'))}; this vgc ({__version__}) reads version "
                f"{VERSION}"]
    found = _entry_problems(manifest.get("entries"))
    if not found:
        found = _file_problems(manifest.get("files"), manifest["entries"])
    return found[:MAX_PROBLEMS]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _entry_problems(entries: Any) -> list[str]:
    if not isinstance(entries, dict) or not entries:
        return ["its manifest's entry list is malformed or empty"]
    if len(entries) > MAX_ENTRIES:
        return [f"its manifest lists {len(entries)} entries, more than {MAX_ENTRIES}"]
    found = []
    for name, entry in entries.items():
        if not ENTRY_NAME.fullmatch(name):
            found.append(f"its manifest names an entry {_short(name)}: an entry's name is 20 hex digits")
        elif not isinstance(entry, dict) or not isinstance(entry.get("factors"), dict):
            found.append(f"its manifest's entry {name} has no factors object")
        elif not isinstance(entry.get("ranks"), list) or not entry["ranks"] or len(entry["ranks"]) > MAX_RANKS:
            found.append(f"its manifest's entry {name} has no list of rank directories (or more than {MAX_RANKS})")
        else:
            bad = next((r for r in entry["ranks"] if not isinstance(r, str) or not RANK_NAME.fullmatch(r)), None)
            if bad is not None:
                found.append(f"its manifest's entry {name} names a rank directory {_short(bad)}: a rank directory "
                             "is rank_<rank>_<dp rank>")
            elif len(set(entry["ranks"])) != len(entry["ranks"]):
                found.append(f"its manifest's entry {name} lists a rank directory twice")
        if len(found) >= MAX_PROBLEMS:
            break
    return found


def _file_problems(files: Any, entries: dict[str, Any]) -> list[str]:
    if not isinstance(files, dict):
        return ["its manifest's file list is malformed"]
    if len(files) > MAX_FILES:
        return [f"its manifest lists {len(files)} files, more than {MAX_FILES}"]
    found = []
    for name, listed in files.items():
        problem = file_name_problem(name)
        if problem is None:
            parts = name.split("/")
            if parts[0] == CACHE_SUBDIR and (len(parts) < 4 or parts[1] not in entries
                                             or parts[2] not in entries[parts[1]]["ranks"]):
                problem = f"file {name!r} is not inside a rank directory of an entry the manifest lists"
            elif not (isinstance(listed, dict) and type(listed.get("size")) is int
                      and 0 <= listed["size"] <= MAX_FILE_SIZE and isinstance(listed.get("sha256"), str)
                      and _SHA256.fullmatch(listed["sha256"])):
                problem = f"its manifest's record of {name!r} is not a size and a sha256"
        if problem:
            found.append(f"its manifest is malformed: {problem}")
            if len(found) >= MAX_PROBLEMS:
                return found
    for name in files:   # a file where another file's directory goes could not be extracted
        parent = name.rpartition("/")[0]
        while parent:
            if parent in files:
                found.append(f"its manifest is malformed: {parent!r} is listed as a file and as the directory of "
                             f"{name!r}")
                break
            parent = parent.rpartition("/")[0]
        if len(found) >= MAX_PROBLEMS:
            break
    return found
