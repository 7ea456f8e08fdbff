"""Reading a cache root: its entries, their manifests and artifacts, what tells entries apart, the closest entry
to a miss, and what to prune."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from vgc.cache import json_data
from vgc.cache.keys import diff_factors, flatten_factors
from vgc.cache.layout import CACHE_SUBDIR, FACTORS_FILE, saved_trace_files_in
from vgc.cache.store import ArtifactStore


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
                    manifest = json_data.loads(path.read_bytes())
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
