"""One-file cache bundles: `vgc cache pack` writes a root's entries (and the kernels they load) into one file
with a manifest, `vgc cache unpack` installs one under another root, on another machine.

A bundle is an uncompressed tar: `manifest.json` first, then the files under their paths in a root
(`torch_compile_cache/<hash>/...`, `inductor_cache/...`). The manifest holds, per entry, the key factors its
start will compare (versions of vgc, Python, torch, Triton and CUDA, the GPU or CPU ISA, the world size, the
configuration and source digests) and its rank directories, and per file its size and sha256. Packing is
reproducible: members sorted, no times, owners or modes. Locks, temporary files and this machine's probe
markers stay behind.

Unpacking checks everything before installing anything: the tar whole, every file against the manifest (and
nothing in the bundle that the manifest does not list), the manifest against each entry's own factors file, and
each entry's factors against this machine (a bundle for another torch or GPU would only ever miss). A refused
bundle names its problems and changes nothing: the next start compiles as if cold. An accepted one is
extracted beside the root and moved into place entry by entry, each under its entry lock; kernels already there
are kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from filelock import FileLock

from vgc._version import __version__
from vgc.cache import inventory, verify
from vgc.cache.cpu_isa import MARKER_DIR as ISA_MARKER_DIR
from vgc.cache.keys import compiles, diff_factors, environment_factors
from vgc.cache.layout import atomic_file, CACHE_SUBDIR, FACTORS_FILE, LOCK_DIR, make_private_dirs, untrusted_reason
from vgc.cache.recovery import INDUCTOR_SUBDIR
from vgc.cache.store import content_hash, factors_problem

BUNDLE_FORMAT = "vgc-cache-bundle"
BUNDLE_VERSION = 1
MANIFEST_NAME = "manifest.json"
_MANIFEST_LIMIT = 64 << 20          # a manifest larger than this is not one vgc wrote
_CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be installed; `problems` says why, one reason each."""

    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = Path(path), problems
        super().__init__(f"{path}: " + "; ".join(problems))


@dataclass
class Bundle:
    """A bundle's manifest and what checking it found (empty `problems`: it can be installed here)."""
    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def entries(self) -> dict[str, Any]:
        return self.manifest.get("entries", {})

    @property
    def size_bytes(self) -> int:
        return sum(f["size"] for f in self.manifest.get("files", {}).values())


# ---- pack ----
def _bundled(relative: PurePosixPath) -> bool:
    """Whether a file under the root travels: not locks, temporary files, hidden files or ISA probe records (whose
    fingerprint names this machine's CPU and interpreter)."""
    name = relative.name
    return LOCK_DIR not in relative.parts and ISA_MARKER_DIR not in relative.parts and not name.startswith(".") \
        and not name.endswith((".lock", ".tmp")) and ".vgc-loads-" not in name


def _files_under(root: Path, top: Path) -> list[tuple[str, Path]]:
    found = []
    for path in sorted(top.rglob("*")):
        relative = PurePosixPath(path.relative_to(root).as_posix())
        if path.is_file() and not path.is_symlink() and _bundled(relative):
            found.append((str(relative), path))
    return found


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o600, 0, 0, "", ""
    return info


def select_entries(root: Path, prefixes: Iterable[str] = ()) -> list[inventory.Entry]:
    """The entries named by hash prefixes (each naming exactly one, as `vgc cache show` takes them), or every entry
    of the root."""
    prefixes = list(prefixes)
    if prefixes:
        return list({e.hash: e for e in (inventory.find_entry(root, p) for p in prefixes)}.values())
    every = sorted(inventory.entries(root), key=lambda e: e.hash)
    if not every:
        raise LookupError(f"no cache entries under {root / CACHE_SUBDIR}")
    return every


def pack(root: Path, output: Path, prefixes: Iterable[str] = (), *, kernels: bool = True) -> dict[str, Any]:
    """Write the chosen entries of `root` (and, with `kernels`, Inductor's kernel cache under it) to `output`, whole
    or not at all; returns the manifest. An entry a start could not load (`vgc cache verify` finds a problem) is
    refused: a bundle must not carry damage to other machines."""
    root, output = Path(root), Path(output)
    if output.is_dir():   # never replaced: it is the user's, not a file vgc wrote
        raise ValueError(f"pack -o {output} names a directory; give a file name, e.g. -o {output / 'cache.vgcb'}")
    chosen = select_entries(root, prefixes)
    damaged = {e.hash: verify.verify_entry(e) for e in chosen}
    damaged = {h: p for h, p in damaged.items() if p}
    if damaged:
        raise ValueError("refusing to pack damaged entries: " + "; ".join(
            f"{h}: {', '.join(p[:3])}" for h, p in damaged.items()) + " (run vgc cache verify, then prune or rebuild)")
    files: list[tuple[str, Path]] = []
    entries: dict[str, Any] = {}
    for entry in chosen:
        stored = entry.manifest()
        if stored is None or factors_problem(stored, entry.hash):
            raise ValueError(f"entry {entry.hash} has no readable {FACTORS_FILE}; it cannot be packed")
        entries[entry.hash] = {"factors": stored["factors"], "ranks": [d.name for d in entry.rank_dirs()]}
        files += _files_under(root, entry.path)
    if kernels and (root / INDUCTOR_SUBDIR).is_dir():
        files += _files_under(root, root / INDUCTOR_SUBDIR)
    listed = {name: {"size": path.stat().st_size, "sha256": content_hash(path)} for name, path in files}
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "vgc_version": __version__,
                "entries": entries, "files": listed}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(output) as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member(MANIFEST_NAME, len(text)), io.BytesIO(text))
        for name, path in files:
            with open(path, "rb") as f:
                tar.addfile(_member(name, listed[name]["size"]), f)
    return manifest


# ---- read and check ----
def _safe_name(name: str) -> str | None:
    """Why a member name could write outside the root, or None."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or not path.parts:
        return f"member {name!r} points outside the root"
    if path.parts[0] not in (CACHE_SUBDIR, INDUCTOR_SUBDIR):
        return f"member {name!r} is not under {CACHE_SUBDIR}/ or {INDUCTOR_SUBDIR}/"
    return None


def _manifest_problem(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return "its manifest is not a JSON object"
    if manifest.get("format") != BUNDLE_FORMAT:
        return f"its manifest's format is {manifest.get('format')!r}, not {BUNDLE_FORMAT!r}"
    if manifest.get("version") != BUNDLE_VERSION:
        return (f"it is bundle version {manifest.get('version')!r}; this vgc ({__version__}) reads version "
                f"{BUNDLE_VERSION}")
    files, entries = manifest.get("files"), manifest.get("entries")
    if not isinstance(files, dict) or not all(
            isinstance(f, dict) and isinstance(f.get("size"), int) and isinstance(f.get("sha256"), str)
            for f in files.values()):
        return "its manifest's file list is malformed"
    if not isinstance(entries, dict) or not entries or not all(
            isinstance(e, dict) and isinstance(e.get("factors"), dict) and isinstance(e.get("ranks"), list)
            for e in entries.values()):
        return "its manifest's entry list is malformed or empty"
    return None


def _environment_problems(entry_hash: str, factors: dict[str, Any]) -> list[str]:
    """What in the entry's environment differs from this machine's: any difference makes every start miss."""
    stored = factors.get("environment")
    if not isinstance(stored, dict):
        return [f"entry {entry_hash} records no environment"]
    device = stored.get("device_type")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return [f"entry {entry_hash} is for CUDA ({stored.get('device_name')}, capability "
                    f"{stored.get('device_capability')}), and this machine has no CUDA device"]
    elif device != "cpu":
        return [f"entry {entry_hash} is for device type {device!r}, which vgc does not know"]
    config = factors.get("config")
    current = environment_factors(device, compiles(config if isinstance(config, dict) else {}))
    differences = diff_factors({"environment": stored}, {"environment": current})
    return [f"entry {entry_hash} was built for another environment: {d}" for d in differences]


def _open(path: Path, problems: list[str]) -> tarfile.TarFile | None:
    try:
        return tarfile.open(path, mode="r:")
    except FileNotFoundError:
        problems.append("no such file")
    except IsADirectoryError:
        problems.append("is a directory, not a bundle")
    except (tarfile.TarError, EOFError, OSError) as error:
        problems.append(f"is not a vgc bundle or is cut short ({type(error).__name__}: {error})")
    return None


def _read_manifest(tar: tarfile.TarFile, problems: list[str]) -> dict[str, Any] | None:
    first = tar.next()
    if first is None or first.name != MANIFEST_NAME or not first.isreg():
        problems.append(f"its first member is not {MANIFEST_NAME}: not a vgc bundle")
        return None
    if first.size > _MANIFEST_LIMIT:
        problems.append(f"its manifest is {first.size} bytes, more than a vgc manifest can be")
        return None
    try:
        manifest = json.loads(tar.extractfile(first).read())
    except (ValueError, UnicodeDecodeError) as error:
        problems.append(f"its manifest is not valid JSON ({error})")
        return None
    except (tarfile.TarError, EOFError, OSError) as error:
        problems.append(f"its manifest is cut short ({error})")
        return None
    problem = _manifest_problem(manifest)
    if problem:
        problems.append(problem)
        return None
    return manifest


def _scan(tar: tarfile.TarFile, manifest: dict[str, Any], problems: list[str], into: Path | None
          ) -> dict[str, bytes]:
    """Check every member against the manifest, writing each file under `into` when given; returns the entries'
    factors files (small), by member name."""
    listed, seen, factors = manifest["files"], set(), {}
    try:
        for member in tar:
            name = member.name
            if member.offset == 0:   # the manifest, read first
                continue
            if not member.isreg():
                problems.append(f"member {name!r} is not a regular file (links and devices are refused)")
                continue
            unsafe = _safe_name(name)
            if unsafe or name in seen or name not in listed:
                problems.append(unsafe or (f"member {name!r} appears twice" if name in seen else
                                           f"member {name!r} is not in the manifest"))
                continue
            seen.add(name)
            h, size, keep = hashlib.sha256(), 0, name.endswith("/" + FACTORS_FILE)
            kept = bytearray()
            source = tar.extractfile(member)
            target = None
            if into is not None:
                destination = into / name
                make_private_dirs(destination.parent)
                target = open(destination, "wb")
            try:
                while chunk := source.read(_CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    if target is not None:
                        _write_chunk(target, chunk)
                    if keep and size <= _MANIFEST_LIMIT:
                        kept += chunk
            finally:
                if target is not None:
                    target.close()
            want = listed[name]
            if size != want["size"] or h.hexdigest() != want["sha256"]:
                problems.append(f"{name} does not match the manifest's content hash (the bundle is damaged)")
            elif keep:
                factors[name] = bytes(kept)
    except _ExtractError as error:
        problems.append(f"cannot be extracted under the root ({error}); free space there or pick another root")
        return factors
    except (tarfile.TarError, EOFError, OSError) as error:
        problems.append(f"is cut short or damaged ({type(error).__name__}: {error})")
        return factors
    missing = sorted(set(listed) - seen)
    if missing:
        # a file cut at a member boundary reads as a shorter, valid archive: its end marker (two zero blocks) is
        # what is missing then
        cut = tar.name is not None and os.path.getsize(tar.name) < tar.offset + 2 * tarfile.BLOCKSIZE
        problems.append(("is cut short (no end-of-archive marker): " if cut else "")
                        + f"{len(missing)} file(s) in the manifest are missing from the bundle, e.g. {missing[0]}")
    return factors


class _ExtractError(Exception):
    """Writing an extracted file failed (a full disk, a read-only root): the root's problem, not the bundle's."""


def _write_chunk(target, chunk: bytes) -> None:
    try:
        target.write(chunk)
    except OSError as error:
        raise _ExtractError(error.strerror or str(error)) from error


def _consistency_problems(manifest: dict[str, Any], read_factors) -> list[str]:
    """The manifest against each entry's own factors file (the manifest alone could claim anything)."""
    problems = []
    for entry_hash, entry in manifest["entries"].items():
        if not entry["ranks"]:
            problems.append(f"entry {entry_hash} has no rank directories")
        for rank in entry["ranks"]:
            name = f"{CACHE_SUBDIR}/{entry_hash}/{rank}/{FACTORS_FILE}"
            if name not in manifest["files"]:
                problems.append(f"entry {entry_hash} lacks {rank}/{FACTORS_FILE}")
                continue
            stored = read_factors(name)
            problem = factors_problem(stored, entry_hash)
            if problem:
                problems.append(f"{name} {problem}")
            elif stored["factors"] != entry["factors"]:
                problems.append(f"the manifest's factors for entry {entry_hash} disagree with its {FACTORS_FILE}")
    return problems


def check(path: Path, *, environment: bool = True, into: Path | None = None) -> Bundle:
    """Read and check a bundle (every byte); with `into`, extract it there as it is read. `environment=False`
    skips the comparison with this machine (`vgc cache show` of a bundle made for another)."""
    bundle = Bundle(Path(path))
    tar = _open(bundle.path, bundle.problems)
    if tar is None:
        return bundle
    with tar:
        manifest = _read_manifest(tar, bundle.problems)
        if manifest is None:
            return bundle
        bundle.manifest = manifest
        factors = _scan(tar, manifest, bundle.problems, into)
        if not bundle.problems:
            bundle.problems += _consistency_problems(manifest, lambda name: _json_or_none(factors.get(name)))
    if not bundle.problems and environment:
        for entry_hash, entry in sorted(manifest["entries"].items()):
            bundle.problems += _environment_problems(entry_hash, entry["factors"])
    return bundle


def _json_or_none(data: bytes | None) -> Any:
    try:
        return json.loads(data) if data is not None else None
    except (ValueError, UnicodeDecodeError):
        return None


# ---- unpack ----
def unpack(path: Path, root: Path) -> dict[str, str]:
    """Install a bundle under `root`; returns what happened per entry ("installed", "replaced" a damaged one, or
    "kept": an intact copy was already there). Raises `BundleError` (nothing installed) when the bundle or the
    root is refused."""
    root = Path(root)
    untrusted = untrusted_reason(root) if root.exists() else None
    if untrusted:
        raise BundleError(path, [f"the cache root {root} {untrusted}"])
    make_private_dirs(root / CACHE_SUBDIR)
    staging = Path(tempfile.mkdtemp(prefix=".vgc-unpack-", dir=root))
    try:
        bundle = check(path, into=staging)
        if bundle.problems:
            raise BundleError(path, bundle.problems)
        outcome = {h: _install_entry(root, staging, h) for h in sorted(bundle.entries)}
        kernels = staging / INDUCTOR_SUBDIR
        if kernels.is_dir():
            make_private_dirs(root / INDUCTOR_SUBDIR)
            for source in sorted(p for p in kernels.rglob("*") if p.is_file()):
                destination = root / source.relative_to(staging)
                if not destination.exists():   # kernels are named by their content: one there is the same
                    make_private_dirs(destination.parent)
                    os.replace(source, destination)
        return outcome
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _install_entry(root: Path, staging: Path, entry_hash: str) -> str:
    target = root / CACHE_SUBDIR / entry_hash
    make_private_dirs(root / LOCK_DIR)
    with FileLock(str(root / LOCK_DIR / f"entry-{entry_hash}.lock")):
        if target.exists():
            if not verify.verify_entry(inventory.Entry(target)):
                return "kept"
            old = Path(tempfile.mkdtemp(prefix=f".vgc-replaced-{entry_hash}-", dir=root))
            os.replace(target, old / entry_hash)
            os.replace(staging / CACHE_SUBDIR / entry_hash, target)
            shutil.rmtree(old, ignore_errors=True)
            return "replaced"
        os.replace(staging / CACHE_SUBDIR / entry_hash, target)
        return "installed"
