"""Reading a cache root: its entries, their manifests and artifacts; verify, prune and explain misses."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from vgc.cache.keys import diff_factors
from vgc.cache.store import ARTIFACT_DIR, FACTORS_FILE, ArtifactStore

CACHE_SUBDIR = "torch_compile_cache"


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
        for rank_dir in self.rank_dirs():
            path = rank_dir / FACTORS_FILE
            if path.exists():
                try:
                    return json.loads(path.read_text())
                except ValueError:
                    return None
        return None

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def last_used(self) -> float:
        times = [p.stat().st_mtime for p in self.path.rglob("*") if p.is_file()]
        return max(times, default=self.path.stat().st_mtime)

    def stores(self) -> Iterator[ArtifactStore]:
        for rank_dir in self.rank_dirs():
            index = rank_dir / "index.json"
            fmt = "binary"
            if index.exists():
                records = json.loads(index.read_text() or "{}")
                fmt = next((r["format"] for r in records.values()), "binary")
            yield ArtifactStore(rank_dir, fmt)


def entries(root: Path) -> list[Entry]:
    base = Path(root) / CACHE_SUBDIR
    if not base.is_dir():
        return []
    return sorted((Entry(p) for p in base.iterdir() if p.is_dir()), key=lambda e: e.last_used(), reverse=True)


def find_entry(root: Path, prefix: str) -> Entry:
    matches = [e for e in entries(root) if e.hash.startswith(prefix)]
    if len(matches) != 1:
        found = "no entry" if not matches else f"{len(matches)} entries"
        raise LookupError(f"{found} under {Path(root) / CACHE_SUBDIR} matches {prefix!r}; see `vgc cache ls`")
    return matches[0]


def verify_entry(entry: Entry) -> list[str]:
    """Problems found: each indexed artifact checked against its recorded content hash."""
    problems = []
    for store in entry.stores():
        index = store.read_index()
        for name, record in sorted(index.items()):
            problem = store.verify(name, record)
            if problem:
                problems.append(f"{store.directory / ARTIFACT_DIR / record['file']}: {problem}")
    return problems


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


def prune(root: Path, older_than_s: float | None = None, max_size: int | None = None) -> list[Entry]:
    """Remove entries unused for `older_than_s`, then least recently used ones until under `max_size` bytes."""
    removed = []
    now = time.time()
    remaining = entries(root)  # most recently used first
    if older_than_s is not None:
        for entry in list(remaining):
            if now - entry.last_used() > older_than_s:
                removed.append(entry)
                remaining.remove(entry)
    if max_size is not None:
        sizes = {e.hash: e.size_bytes() for e in remaining}
        total = sum(sizes.values())
        while remaining and total > max_size:
            entry = remaining.pop()
            total -= sizes[entry.hash]
            removed.append(entry)
    for entry in removed:
        shutil.rmtree(entry.path, ignore_errors=True)
    return removed
