"""`vgc cache ls | show | verify | prune | why-miss`."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from vgc import envs
from vgc.cache import inventory
from vgc.cache.keys import cache_key, diff_factors, environment_factors, source_factors


def add_parser(commands) -> None:
    cache = commands.add_parser("cache", help="inspect and manage the compile cache")
    cache.add_argument("--root", help="cache root (default: $VGC_CACHE_ROOT or ~/.cache/vgc)")
    sub = cache.add_subparsers(dest="cache_command", required=True)
    sub.add_parser("ls", help="list entries: hash, size, age, model sources, torch version")
    show = sub.add_parser("show", help="an entry's key factors, pieces and sizes")
    show.add_argument("hash", help="the entry's hash or a unique prefix of it")
    sub.add_parser("verify", help="check every artifact against its recorded content hash")
    prune = sub.add_parser("prune", help="remove old entries, then least recently used ones above a size")
    prune.add_argument("--older-than", help="e.g. 12h, 7d, 2w")
    prune.add_argument("--max-size", help="e.g. 500M, 2G")
    why = sub.add_parser("why-miss", help="name the factors that differ between the cache and now")
    why.add_argument("--options", default="{}", help="the CompilationConfig fields as JSON, as passed to vgc")
    why.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    why.add_argument("--entry", help="compare with this entry (default: the closest one)")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (LookupError, ValueError) as e:
        print(f"vgc cache: {e}")
        return 2


def _run(args: argparse.Namespace) -> int:
    root = Path(args.root).expanduser() if args.root else envs.cache_root()
    command = args.cache_command
    if command == "ls":
        return _ls(root)
    if command == "show":
        return _show(root, args.hash)
    if command == "verify":
        return _verify(root)
    if command == "prune":
        return _prune(root, args.older_than, args.max_size)
    return _why_miss(root, args)


def _ls(root: Path) -> int:
    found = inventory.entries(root)
    if not found:
        print(f"no cache entries under {root / inventory.CACHE_SUBDIR}")
        return 0
    print(f"{'hash':22s} {'size':>10s} {'age':>5s}  {'torch':14s} model sources")
    now = time.time()
    for entry in found:
        manifest = entry.manifest() or {}
        factors = manifest.get("factors", {})
        sources = ", ".join(name for name, _ in factors.get("sources", [])) or "?"
        torch_version = factors.get("environment", {}).get("torch_version", "?")
        print(f"{entry.hash:22s} {_mib(entry.size_bytes()):>10s} {_age(now - entry.last_used()):>5s}  "
              f"{torch_version:14s} {sources}")
    return 0


def _show(root: Path, prefix: str) -> int:
    entry = inventory.find_entry(root, prefix)
    manifest = entry.manifest() or {}
    print(f"entry {entry.hash} ({entry.path}), {_mib(entry.size_bytes())}")
    print(json.dumps(manifest.get("factors", {}), indent=2, sort_keys=True))
    for store in entry.stores():
        index = store.read_index()
        print(f"\n{store.directory.name}: {len(index)} artifacts")
        for name, record in sorted(index.items(), key=lambda kv: (kv[1].get("piece", ""), str(kv[1].get("size")))):
            size = record.get("size")
            print(f"  {record.get('piece', '?'):10s} size={'dynamic' if size is None else size:8}  {record['format']:8s} "
                  f"{name}")
    return 0


def _verify(root: Path) -> int:
    found = inventory.entries(root)
    problems = [p for entry in found for p in inventory.verify_entry(entry)]
    count = sum(len(store.read_index()) for entry in found for store in entry.stores())
    for problem in problems:
        print(f"BAD  {problem}")
    print(f"{count} artifacts in {len(found)} entries checked, {len(problems)} bad")
    return 1 if problems else 0


def _prune(root: Path, older_than: str | None, max_size: str | None) -> int:
    if older_than is None and max_size is None:
        raise SystemExit("vgc cache prune: give --older-than and/or --max-size")
    removed = inventory.prune(root, inventory.parse_duration(older_than) if older_than else None,
                              inventory.parse_size(max_size) if max_size else None)
    for entry in removed:
        print(f"removed {entry.hash}")
    print(f"{len(removed)} entries removed, {len(inventory.entries(root))} left")
    return 0


def _current_sources(manifest: dict) -> list[list[str]]:
    """Re-hash the files the entry was traced from, where they still exist."""
    paths = [p for p in manifest.get("source_paths", []) if os.path.isfile(p)]
    return source_factors(paths) if paths else manifest.get("factors", {}).get("sources", [])


def _why_miss(root: Path, args) -> int:
    from vgc.config import CompilationConfig

    config = CompilationConfig.from_options(json.loads(args.options))
    env = environment_factors(args.device)
    candidates = [inventory.find_entry(root, args.entry)] if args.entry else inventory.entries(root)
    if not candidates:
        print(f"no cache entries under {root / inventory.CACHE_SUBDIR}: every compile is a miss")
        return 0
    best = None
    for entry in candidates:
        manifest = entry.manifest() or {}
        _, current = cache_key(config.hash_factors(), env, _current_sources(manifest))
        differences = diff_factors(manifest.get("factors", {}), current)
        if best is None or len(differences) < len(best[1]):
            best = (entry, differences)
    entry, differences = best
    if not differences:
        print(f"entry {entry.hash} matches the current config and environment: it would be a hit")
        return 0
    print(f"closest entry {entry.hash} differs in {len(differences)} factor(s):")
    for line in differences:
        print(f"  {line}")
    return 1
