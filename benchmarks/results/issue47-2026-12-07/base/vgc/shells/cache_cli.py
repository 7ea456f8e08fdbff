"""`vgc cache ls | show | verify | prune | why-miss | pack | unpack`: the cache seen from the shell (their
arguments are declared in `vgc/shells/cli.py`).

Exit status: 0 when all is well, 1 when the command found a problem (`verify`: a bad path or a bad bundle;
`why-miss`: the compile would miss; `unpack`: the bundle was refused), 2 for a usage error (argparse's, bad
`--options` JSON, a hash prefix that names no single entry, a root to read that is missing or not a directory),
when `verify` cannot check the root (its own failure), when `unpack` cannot install under the root (read-only,
full, untrusted, an entry lock held by another process too long), or when `why-miss` cannot tell (a traced source
file it cannot find: pass `--sources`). Errors are one line, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path, PurePath
from typing import Any

from vgc import envs
from vgc.cache import inventory, layout, saved_traces
from vgc.cache.keys import cache_key, compiles, diff_factors, environment_factors, source_factors
from vgc.config import CompilationConfig
from vgc.shells import bundle as bundles
from vgc.shells import verify

_LS_WIDTH = 120   # the differences line of `ls` stops adding factors here


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
        # On stdout, where scripts already read it; argparse's own usage errors go to stderr.
        print(f"vgc cache {args.cache_command}: {e}")
        return 2


def _existing(root: Path) -> Path:
    """`root`, checked for a command that reads it: a mistyped --root must not read as an empty cache (`ls`, `prune`
    and `why-miss` would report on nothing), so a missing one is a `ValueError` (status 2). `verify` checks its root
    itself, naming a looping symlink too."""
    if not root.is_dir():
        problem = "is not a directory" if root.exists() else "does not exist"
        raise ValueError(f"cache root {root} {problem}; pass the root the cache was written under (--root) or set "
                         "VGC_CACHE_ROOT")
    return root


def _run(args: argparse.Namespace) -> int:
    root = Path(args.root).expanduser() if args.root else envs.cache_root()
    command = args.cache_command
    if command == "ls":
        return _ls(_existing(root))
    if command == "show":
        return _show_bundle(Path(args.hash)) if Path(args.hash).is_file() else _show(_existing(root), args.hash)
    if command == "verify":
        return _verify_bundle(Path(args.bundle)) if args.bundle else _verify(root)
    if command == "pack":
        return _pack(_existing(root), args.hashes, Path(args.output), not args.no_kernels)
    if command == "unpack":   # creates the root if need be
        return _unpack(Path(args.bundle), root)
    if command == "prune":
        return _prune(_existing(root), args.older_than, args.max_size, args.dry_run)
    return _why_miss(_existing(root), args)


def _short(value: Any) -> str:
    """A factor's value in a few characters: digests cut to 8 hex digits, long values cut with '...'."""
    if value is inventory.ABSENT:
        return "-"
    if isinstance(value, str):
        is_digest = len(value) >= 16 and all(c in "0123456789abcdef" for c in value)
        return value[:8] if is_digest else (value if len(value) <= 24 else value[:21] + "...")
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 24 else text[:21] + "..."


def _differences_line(varying: dict[str, Any]) -> str:
    # Config first: it is what a user changes on purpose; then edited sources; then the machine and versions.
    order = {"config": 0, "sources": 1}
    names = sorted(varying, key=lambda n: (order.get(n.split(".", 1)[0], 2), n))
    # Without the section: `compile_sizes`, `model.py` and `torch_version` say which section they are from.
    items = [f"{name.split('.', 1)[-1]}={_short(varying[name])}" for name in names]

    def more(n: int) -> str:
        return f"  (+{n} more; see vgc cache show)" if n else ""

    line, shown = "    differs:", 0
    # Room is kept for the "+N more" note, so the line never passes the width.
    while shown < len(items) and len(f"{line}  {items[shown]}{more(len(items) - shown - 1)}") <= _LS_WIDTH:
        line, shown = f"{line}  {items[shown]}", shown + 1
    return line + more(len(items) - shown)


def _distinct_tails(paths: list[str]) -> list[str]:
    """Each path cut to its shortest tail (the file name, then its parents') that no other path ends with."""
    parts = [PurePath(p).relative_to(PurePath(p).anchor).parts for p in paths]
    depth = [1] * len(parts)
    while True:
        tails = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        grow = [i for i, t in enumerate(tails) if tails.count(t) > 1 and depth[i] < len(parts[i])]
        if not grow:
            return tails
        for i in grow:
            depth[i] += 1


def _source_names(manifest: dict[str, Any]) -> list[str]:
    """The traced files of an entry as `ls` names them. Two files of one name (`modeling.py` of two packages) would
    read as one file listed twice: they get as much of their recorded paths as tells them apart, or, in an entry
    written before paths were kept, their digests."""
    if manifest.get("source_paths"):
        return sorted(_distinct_tails(sorted(set(manifest["source_paths"]))))
    sources = manifest.get("factors", {}).get("sources", [])
    names = [name for name, _ in sources]
    return [name if names.count(name) == 1 else f"{name}@{_short(digest)}" for name, digest in sources]


def _ls(root: Path) -> int:
    found = inventory.entries(root)
    if not found:
        print(f"no cache entries under {root / layout.CACHE_SUBDIR}")
        return 0
    varying = inventory.distinguishing_factors(found)
    print(f"{'hash':22s} {'size':>10s} {'age':>5s}  {'torch':14s} {'config':8s}  model sources")
    now = time.time()
    for entry in found:
        manifest = entry.manifest() or {}
        factors = manifest.get("factors", {})
        sources = ", ".join(_source_names(manifest)) or "?"
        torch_version = factors.get("environment", {}).get("torch_version", "?")
        config = inventory.config_digest(factors["config"]) if "config" in factors else "?"
        print(f"{entry.hash:22s} {_mib(entry.size_bytes()):>10s} {_age(now - entry.last_used()):>5s}  "
              f"{torch_version:14s} {config:8s}  {sources}")
        if entry.hash not in varying:
            print(f"    no readable {layout.FACTORS_FILE}: not written yet, or damaged")
        elif varying[entry.hash]:
            print(_differences_line(varying[entry.hash]))
    return 0


def _show(root: Path, prefix: str) -> int:
    entry = inventory.find_entry(root, prefix)
    manifest = entry.manifest() or {}
    print(f"entry {entry.hash} ({entry.path}), {_mib(entry.size_bytes())}")
    print(json.dumps(manifest.get("factors", {}), indent=2, sort_keys=True))
    for store in entry.stores():
        index = store.read_index()
        print(f"\n{store.directory.name}: {len(index)} artifacts")
        for name, record in sorted(index.items(), key=lambda kv: (str(kv[1].get("piece", "")), str(kv[1].get("size")))):
            size = record.get("size")
            print(f"  {str(record.get('piece', '?')):10s} size={'dynamic' if size is None else size:8}  "
                  f"{record['format']:8s} {name}")
    return 0


def _verify(root: Path) -> int:
    try:
        report = verify.check_root(root)
    except verify.CannotVerify:
        raise   # a one-line error with status 2, from run()
    except Exception as e:  # verify's own failure must read "cannot check" (2), never "bad" (1)
        print(f"vgc cache verify: cannot check {root}: {type(e).__name__}: {e}")
        return 2
    for path, problem in report.bad:
        print(f"BAD  {path}: {problem}")
    for path in report.unindexed:
        print(f"info {path}: unindexed (no index record names it; a start ignores it)")
    print(f"{report.artifacts} artifacts in {report.entries} entries checked, {len(report.bad)} bad")
    return 1 if report.bad else 0


def _pack(root: Path, hashes: list[str], output: Path, kernels: bool) -> int:
    manifest = bundles.pack(root, output, hashes, kernels=kernels)
    files = manifest["files"]
    print(f"packed {len(manifest['entries'])} entries ({', '.join(sorted(manifest['entries']))}) and "
          f"{sum(1 for n in files if n.startswith(bundles.INDUCTOR_SUBDIR + '/'))} kernel files: {len(files)} files, "
          f"{_mib(sum(f['size'] for f in files.values()))} -> {output}")
    return 0


def _print_problems(path: Path, problems: list[str]) -> None:
    for problem in problems:
        print(f"BAD  {path}: {problem}")


def _unpack(path: Path, root: Path) -> int:
    try:
        with _terminate_as_exit():
            outcome = bundles.unpack(path, root)
    except bundles.BundleError as error:
        _print_problems(path, error.problems)
        print(f"refused {path}: nothing installed under {root}; a start there compiles as if cold")
        return 1
    except bundles.RootError as error:
        print(f"vgc cache unpack: {error.problem}")
        for entry_hash, what in error.installed.items():
            print(f"{what:9s} {entry_hash}")
        print(f"{'only the entries above were' if error.installed else 'nothing was'} installed under {root}: the "
              f"root's problem, not the bundle's")
        return 2
    for entry_hash, what in outcome.items():
        print(f"{what:9s} {entry_hash}")
    print(f"unpacked {path} under {root}")
    return 0


@contextlib.contextmanager
def _terminate_as_exit():
    """SIGTERM and SIGHUP (a job stopped, a terminal closed) end `unpack` as Ctrl-C does, through its cleanup (the
    staging copy in the root removed), instead of ending the process where it stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _show_bundle(path: Path) -> int:
    found = bundles.check(path, environment=False)
    if not found.manifest:
        _print_problems(path, found.problems)
        return 1
    print(f"bundle {path}: {len(found.entries)} entries, {len(found.manifest['files'])} files, "
          f"{_mib(found.size_bytes)}, packed by vgc {found.manifest.get('vgc_version')}")
    for entry_hash, entry in sorted(found.entries.items()):
        environment = entry["factors"].get("environment", {})
        print(f"\nentry {entry_hash}, ranks {', '.join(entry['ranks'])}")
        print(json.dumps(environment, indent=2, sort_keys=True))
    _print_problems(path, found.problems)
    return 1 if found.problems else 0


def _verify_bundle(path: Path) -> int:
    found = bundles.check(path)
    _print_problems(path, found.problems)
    files = len(found.manifest.get("files", {}))
    print(f"{files} files in {len(found.entries)} entries checked, {len(found.problems)} problems"
          + ("" if found.problems else "; it can be unpacked here"))
    return 1 if found.problems else 0


def _prune(root: Path, older_than: str | None, max_size: str | None, dry_run: bool) -> int:
    if older_than is None and max_size is None:
        raise ValueError("give --older-than and/or --max-size, e.g. --older-than 7d")
    limits = (inventory.parse_duration(older_than) if older_than else None,
              inventory.parse_size(max_size) if max_size else None)
    now = time.time()
    chosen = inventory.select_for_prune(root, *limits)
    verb = "would remove" if dry_run else "removed"
    for entry in chosen:
        line = f"{verb} {entry.hash}  {_mib(entry.size_bytes())}, last used {_age(now - entry.last_used())} ago"
        if not dry_run:
            entry.remove()
        print(line)
    left = len(inventory.entries(root)) - (len(chosen) if dry_run else 0)
    print(f"{len(chosen)} entries {'would be ' if dry_run else ''}removed, {left} left")
    return 0


class _SourceRoots:
    """The `--sources` directories, each listed once: every file under them, by name."""

    def __init__(self, roots: list[Path]):
        self.roots = roots
        self.by_name: list[dict[str, list[Path]]] = []
        for root in roots:
            files: dict[str, list[Path]] = {}
            for path in root.rglob("*"):
                if path.is_file():
                    files.setdefault(path.name, []).append(path)
            self.by_name.append(files)

    def locate(self, recorded: str) -> Path | None:
        """Where the file traced at `recorded` (a path on the machine that built the cache) is under a root: the
        longest tail of its path that exists there, else a file of its name found once under a root."""
        parts = Path(recorded).parts[1:]
        for start in range(len(parts)):
            for root in self.roots:
                candidate = root.joinpath(*parts[start:])
                if candidate.is_file():
                    return candidate
        for files in self.by_name:
            found = files.get(Path(recorded).name, [])
            if len(found) == 1:
                return found[0]
        return None


def _current_sources(manifest: dict, roots: _SourceRoots) -> tuple[list[list[str]], list[str], int]:
    """Hash the sources a start here would trace: found under `roots` (`--sources`) first, else at the paths the
    entry recorded. Returns the source factors, the recorded paths found nowhere, and how many came from roots.

    A file found nowhere is unknown: re-using its stored hash would call a start that misses a hit."""
    if not manifest.get("source_paths"):   # an entry written before paths were kept: only its hashes are known
        return manifest.get("factors", {}).get("sources", []), [], 0
    paths, missing, relocated = [], [], 0
    for recorded in manifest["source_paths"]:
        found = roots.locate(recorded)
        if found is not None:
            paths.append(str(found))
            relocated += 1
        elif os.path.isfile(recorded):
            paths.append(recorded)
        else:
            missing.append(recorded)
    return source_factors(paths), missing, relocated


def _config_from_options(text: str) -> dict[str, Any]:
    try:
        options = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--options is not valid JSON ({e}); pass the CompilationConfig fields as a JSON object, "
                         """e.g. --options '{"compile_sizes": [1, 8]}'""") from None
    if not isinstance(options, dict):
        raise ValueError(f"--options must be a JSON object of CompilationConfig fields, got {text!r}")
    try:
        return CompilationConfig.from_options(options).hash_factors()
    except (TypeError, ValueError) as e:
        raise ValueError(f"--options: {e}") from None


def _stored_manifest(entry: inventory.Entry) -> dict[str, Any]:
    manifest = entry.manifest()
    if not manifest or "config" not in manifest.get("factors", {}):
        raise ValueError(f"entry {entry.hash} has no readable {layout.FACTORS_FILE}; pass its config with "
                         "--options")
    return manifest


def _environment(device: str, config: dict[str, Any]) -> dict[str, Any]:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this process sees no CUDA device; run why-miss on a machine with the GPU "
                         "that will load the cache")
    return environment_factors(device, compiles(config))


def _why_miss(root: Path, args) -> int:
    named = inventory.find_entry(root, args.entry) if args.entry else None
    if named is None:
        config = _config_from_options("{}" if args.options is None else args.options)
        candidates = inventory.entries(root)
        device = args.device or "cpu"
    else:
        stored = _stored_manifest(named)["factors"]
        if args.options is None:
            config = stored["config"]
            print(f"config: as stored in entry {named.hash} (digest {inventory.config_digest(config)})")
        else:
            config = _config_from_options(args.options)
        candidates = [named]
        device = args.device or stored.get("environment", {}).get("device_type", "cpu")
    if not candidates:
        print(f"no cache entries under {root / layout.CACHE_SUBDIR}: every compile is a miss")
        return 1
    env = _environment(device, config)
    directories = [Path(d).expanduser() for d in args.sources or []]
    for directory in directories:
        if not directory.is_dir():
            raise ValueError(f"--sources {directory}: not a directory; pass the directory the model's code lives "
                             "in")
    roots = _SourceRoots(directories)
    best = None
    for entry in candidates:
        manifest = entry.manifest() or {}
        sources, missing, relocated = _current_sources(manifest, roots)
        _, current = cache_key(config, env, sources)
        # A file found nowhere is left out of the comparison, and the verdict says so.
        stored = dict(manifest.get("factors", {}))
        if missing:
            gone = {os.path.basename(p) for p in missing}
            stored["sources"] = [s for s in stored.get("sources", []) if s[0] not in gone]
        differences = diff_factors(stored, current)
        if best is None or (len(differences), len(missing)) < (len(best[1]), len(best[2])):
            best = (entry, differences, missing, relocated)
    entry, differences, missing, relocated = best
    if relocated:
        print(f"sources: {relocated} of the traced files found under --sources, hashed there")
    if differences:
        print(f"{'entry' if named else 'closest entry'} {entry.hash} differs in {len(differences)} factor(s):")
        for line in differences:
            print(f"  {line}")
    elif not missing:
        print(f"entry {entry.hash} matches the current config and environment: it would be a hit")
    if missing:
        print(f"unknown: {len(missing)} traced source file(s) of entry {entry.hash} are not at the paths the cache "
              "was built from" + (" nor under --sources" if directories else "") + ", so whether a start hits "
              "cannot be told; pass --sources DIR (the directory the model's code lives in here):")
        for path in missing:
            print(f"  {path}")
        _explain_saved_traces(entry, hit=False)
        return 1 if differences else 2
    _explain_saved_traces(entry, hit=not differences)
    return 0 if not differences else 1


def _explain_saved_traces(entry: inventory.Entry, hit: bool) -> None:
    """What a `vgc.compile` start would do with the entry's saved traces (one per model and input contract)."""
    traces = inventory.saved_trace_files(entry)
    if not traces:
        print("saved traces: none in this entry (a vgc.compile start traces with Dynamo, then saves one)")
        return
    for path in traces:
        problem = saved_traces.problem(path)
        if problem:
            verdict = f"damaged ({problem}): a start warns and traces again"
        elif hit:
            verdict = ("whole: a start of the model and inputs it was traced for loads it, with no Dynamo trace, "
                       "if the model's state passes the trace's checks")
        else:
            verdict = "stale with its entry: a start traces again"
        print(f"saved trace {path.relative_to(entry.path)}: {verdict}")
