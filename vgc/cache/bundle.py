"""One-file cache bundles: `vgc cache pack` writes a root's entries (and the kernels they load) into one file
with a manifest, `vgc cache unpack` installs one under another root, on another machine.

A bundle is an uncompressed tar: `manifest.json` first, then the files under their paths in a root
(`torch_compile_cache/<hash>/...`, `inductor_cache/...`). The manifest holds, per entry, the key factors its
start will compare (versions of vgc, Python, torch, Triton and CUDA, the GPU or CPU ISA, the world size, the
configuration and source digests) and its rank directories, and per file its size and sha256. Packing is
reproducible: members sorted, no times, owners or modes. Locks, temporary files and this machine's probe
markers stay behind.

Unpacking checks everything before installing anything: the manifest as data (`bundle_manifest`), the tar whole,
every file against the manifest (and nothing in the bundle that the manifest does not list), each entry's index
and saved traces against the files (an entry damaged before its hashes were recomputed), the manifest against each
entry's own factors file, and each entry's factors against this machine (a bundle for another torch or GPU would
only ever miss). A refused bundle names its problems and changes nothing: the next start compiles as if cold. An
accepted one is extracted into a staging directory in the root, and moved into place once every entry's lock is
held: kernels first (a missing or damaged one), then each entry. A problem of the root (read-only, full, a lock
held too long) is a `RootError`, never blamed on the bundle.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from filelock import FileLock, Timeout

from vgc._version import __version__
from vgc.cache import bundle_manifest, inventory, json_data, kernel_hashes, recovery, saved_traces, verify
from vgc.cache.cpu_isa import MARKER_DIR as ISA_MARKER_DIR
from vgc.cache.keys import compiles, diff_factors, environment_factors
from vgc.cache.layout import (ARTIFACT_DIR, atomic_file, CACHE_SUBDIR, FACTORS_FILE, INDEX_FILE, LOCK_DIR,
                              make_private_dirs, saved_trace_files_in, TRACE_PREFIX, TRACE_SUFFIX, untrusted_reason)
from vgc.cache.recovery import INDUCTOR_SUBDIR
from vgc.cache.store import bound_elsewhere, content_hash, factors_problem, record_problem

logger = logging.getLogger("vgc")

BUNDLE_FORMAT = bundle_manifest.FORMAT
BUNDLE_VERSION = bundle_manifest.VERSION
MANIFEST_NAME = "manifest.json"
_MANIFEST_LIMIT = bundle_manifest.MAX_BYTES   # a manifest larger than this is not one vgc wrote
_CHUNK = 1 << 20
LOCK_WAIT_S = 60.0   # how long unpack waits for an entry lock another process holds, then gives up
_STAGING, _REPLACED = ".vgc-unpack-", ".vgc-replaced-"   # + "<pid>-": what a killed unpack leaves in the root


class BundleError(Exception):
    """A bundle that cannot be installed; `problems` says why, one reason each."""

    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = Path(path), problems
        super().__init__(f"{path}: " + "; ".join(problems))


class RootError(Exception):
    """The root cannot take a bundle (read-only, full, untrusted, an entry lock held too long): nothing of the
    bundle is wrong. `installed` names the entries installed before the problem (usually none)."""

    def __init__(self, root: Path, problem: str, installed: dict[str, str] | None = None):
        self.root, self.problem, self.installed = Path(root), problem, installed or {}
        super().__init__(f"{root}: {problem}")


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
        manifest = bundle_manifest.parse(tar.extractfile(first).read())
    except json_data.JsonLimitError as error:
        problems.append(str(error))
        return None
    except (ValueError, UnicodeDecodeError) as error:
        problems.append(f"its manifest is not valid JSON ({error})")
        return None
    except (tarfile.TarError, EOFError, OSError) as error:
        problems.append(f"its manifest is cut short ({error})")
        return None
    found = bundle_manifest.problems(manifest)
    if found:
        problems.extend(found)
        return None
    return manifest


def _kept_whole(name: str) -> bool:
    """The members whose text the checks after the scan read (small JSON files of each rank directory)."""
    return name.startswith(CACHE_SUBDIR + "/") and name.count("/") == 3 and \
        name.endswith(("/" + FACTORS_FILE, "/" + INDEX_FILE, "/" + kernel_hashes.RECORD_FILE))


def _module(name: str) -> str | None:
    """The path under Inductor's cache of a generated module the bundle holds, named by its source's hash."""
    prefix = INDUCTOR_SUBDIR + "/"
    relative = name[len(prefix):] if name.startswith(prefix) else ""
    return relative if kernel_hashes.named_module(relative) else None


def _is_trace(name: str) -> bool:
    base = name.rpartition("/")[2]
    return name.startswith(CACHE_SUBDIR + "/") and name.count("/") == 3 and base.startswith(TRACE_PREFIX) and \
        base.endswith(TRACE_SUFFIX)


def _scan(tar: tarfile.TarFile, manifest: dict[str, Any], problems: list[str], into: Path | None
          ) -> tuple[dict[str, bytes], dict[str, str]]:
    """Check every member against the manifest (and every saved trace against its own hash), writing each file
    under `into` when given; returns the rank directories' factors and index files (small), by member name, and
    the generated modules whose text is not what their names say ({path under Inductor's cache: member}). A write
    that fails raises `_ExtractError`: the root's problem, not the bundle's."""
    listed, seen, kept = manifest["files"], set(), {}
    modules = {}
    try:
        for member in tar:
            name = member.name
            if member.offset == 0:   # the manifest, read first
                continue
            if not member.isreg():
                problems.append(f"member {name!r} is not a regular file (links and devices are refused)")
                continue
            if name in seen or name not in listed:
                problems.append(f"member {name!r} appears twice" if name in seen else
                                bundle_manifest.file_name_problem(name) or f"member {name!r} is not in the manifest")
                continue
            seen.add(name)
            h, size, keep = hashlib.sha256(), 0, _kept_whole(name)
            module = _module(name)
            trace = saved_traces.StreamCheck(*name.split("/")[1:3]) if _is_trace(name) else None
            whole = bytearray()
            source = tar.extractfile(member)
            target = _create(into / name) if into is not None else None
            try:
                while chunk := source.read(_CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    if target is not None:
                        _write_chunk(target, chunk)
                    if (keep and size <= _MANIFEST_LIMIT) or module is not None:
                        whole += chunk
                    if trace is not None:
                        trace.update(chunk)
            finally:
                if target is not None:
                    _close(target)
            want = listed[name]
            if size != want["size"] or h.hexdigest() != want["sha256"]:
                problems.append(f"{name} does not match the manifest's content hash (the bundle is damaged)")
            elif trace is not None and trace.problem():
                problems.append(f"{name} {trace.problem()}: the saved trace was damaged before it was packed")
            elif keep:
                kept[name] = bytes(whole)
            elif module is not None and kernel_hashes.holds_its_name(module, bytes(whole)) is False:
                modules[module] = name
    except (tarfile.TarError, EOFError, OSError) as error:
        problems.append(f"is cut short or damaged ({type(error).__name__}: {error})")
        return kept, modules
    missing = sorted(set(listed) - seen)
    if missing:
        # a file cut at a member boundary reads as a shorter, valid archive: its end marker (two zero blocks) is
        # what is missing then
        cut = tar.name is not None and os.path.getsize(tar.name) < tar.offset + 2 * tarfile.BLOCKSIZE
        problems.append(("is cut short (no end-of-archive marker): " if cut else "")
                        + f"{len(missing)} file(s) in the manifest are missing from the bundle, e.g. {missing[0]}")
    return kept, modules


class _ExtractError(Exception):
    """Writing an extracted file failed (a full disk, a read-only root): the root's problem, not the bundle's."""

    def __init__(self, error: OSError):
        self.error = error
        super().__init__(error.strerror or str(error))


def _create(destination: Path):
    try:
        make_private_dirs(destination.parent)
        return open(destination, "xb")
    except OSError as error:
        raise _ExtractError(error) from error


def _write_chunk(target, chunk: bytes) -> None:
    try:
        target.write(chunk)
    except OSError as error:
        raise _ExtractError(error) from error


def _close(target) -> None:
    try:
        target.close()   # a full disk can refuse the buffered end of the file here
    except OSError as error:
        raise _ExtractError(error) from error


def _consistency_problems(manifest: dict[str, Any], read_json) -> list[str]:
    """The manifest against each entry's own factors file (the manifest alone could claim anything), and each
    entry's index against the files: pack refuses a damaged entry, so an index record that does not match its
    file is damage done after packing, with the bundle's hashes recomputed to hide it."""
    problems = []
    for entry_hash, entry in manifest["entries"].items():
        for rank in entry["ranks"]:
            base = f"{CACHE_SUBDIR}/{entry_hash}/{rank}"
            name = f"{base}/{FACTORS_FILE}"
            if name not in manifest["files"]:
                problems.append(f"entry {entry_hash} lacks {rank}/{FACTORS_FILE}")
                continue
            stored = read_json(name)
            problem = factors_problem(stored, entry_hash)
            if problem:
                problems.append(f"{name} {problem}")
            elif stored["factors"] != entry["factors"]:
                problems.append(f"the manifest's factors for entry {entry_hash} disagree with its {FACTORS_FILE}")
            problems += _index_problems(base, manifest["files"], read_json)
            problems += _kernel_problems(base, manifest["files"], read_json)
    return problems


def _kernel_problems(base: str, files: dict[str, Any], read_json) -> list[str]:
    """A rank directory's kernel hashes against the bundled kernel files (a bundle packed `--no-kernels` has none:
    the target builds them)."""
    name = f"{base}/{kernel_hashes.RECORD_FILE}"
    if name not in files:
        return []
    record = read_json(name)
    if not isinstance(record, dict):
        return [f"{name} is not a JSON object of kernel hashes"]
    problems = []
    for relative, value in sorted(record.items()):
        want = kernel_hashes.digest(value) if isinstance(value, str) else None
        if files.get(f"{INDUCTOR_SUBDIR}/{relative}", {"sha256": want})["sha256"] != want:
            problems.append(f"{INDUCTOR_SUBDIR}/{relative} does not match the content hash {name} records (swapped "
                            "with another kernel or altered before packing)")
    return problems[:10]


def _module_problems(misnamed: dict[str, str], kept: dict[str, bytes]) -> list[str]:
    """Generated modules that hold other code than their names say, unless a record marks the name as not the
    source's hash: records recomputed over swapped modules pass the content hashes, not this."""
    free = {relative for name, data in kept.items() if name.endswith("/" + kernel_hashes.RECORD_FILE)
            for relative, value in (_json_or_none(data) or {}).items()
            if isinstance(value, str) and kernel_hashes.free_name(value)}
    return [f"{name} holds other code than its name says (Inductor names a generated module by a hash of its "
            "source): swapped with another kernel, with its content hash recorded over it"
            for relative, name in sorted(misnamed.items()) if relative not in free][:10]


def _index_problems(base: str, files: dict[str, Any], read_json) -> list[str]:
    """A rank directory's `index.json` against the bundled artifact files it names."""
    name = f"{base}/{INDEX_FILE}"
    artifacts = f"{base}/{ARTIFACT_DIR}/"
    if name not in files:
        stored = sum(1 for f in files if f.startswith(artifacts))
        return [f"{name} is missing while {stored} artifact files are bundled: a start would compile every "
                "artifact again"] if stored else []
    index = read_json(name)
    if not isinstance(index, dict):
        return [f"{name} is not a JSON object of artifact records: a start would compile every artifact again"]
    binding = base[len(CACHE_SUBDIR) + 1:]   # <entry>/<rank>
    elsewhere = bound_elsewhere(index, binding)
    if elsewhere:
        return [f"{name} was written for {', '.join(elsewhere[:2])}, not for {binding} (copied or swapped in from "
                "another entry); the entry inside the bundle is damaged"]
    problems = []
    for artifact, record in sorted(index.items()):
        problem = record_problem(record)
        if problem is None:
            wanted = {record["file"]: (record["bytes"], record["sha256"])} if record["format"] == "binary" else \
                {f"{record['file']}/{rel}": (None, digest) for rel, digest in record["files"].items()}
            for file, (size, digest) in wanted.items():
                got = files.get(artifacts + file)
                if got is None:
                    problem = f"its file {file} is not in the bundle"
                elif got["sha256"] != digest or (size is not None and got["size"] != size):
                    problem = f"its file {file} does not match the record's content hash"
                if problem:
                    break
        if problem:
            problems.append(f"{name}: artifact {artifact!r} is damaged ({problem}); the entry inside the bundle "
                            "is damaged")
    return problems


def check(path: Path, *, environment: bool = True, into: Path | None = None) -> Bundle:
    """Read and check a bundle (every byte); with `into`, extract it there as it is read (a write that fails raises
    `_ExtractError`). `environment=False` skips the comparison with this machine (`vgc cache show` of a bundle made
    for another)."""
    bundle = Bundle(Path(path))
    tar = _open(bundle.path, bundle.problems)
    if tar is None:
        return bundle
    with tar:
        manifest = _read_manifest(tar, bundle.problems)
        if manifest is None:
            return bundle
        bundle.manifest = manifest
        kept, misnamed = _scan(tar, manifest, bundle.problems, into)
        if not bundle.problems:
            bundle.problems += _consistency_problems(manifest, lambda name: _json_or_none(kept.get(name)))
        if not bundle.problems:
            bundle.problems += _module_problems(misnamed, kept)
    if not bundle.problems and environment:
        for entry_hash, entry in sorted(manifest["entries"].items()):
            bundle.problems += _environment_problems(entry_hash, entry["factors"])
    return bundle


def _json_or_none(data: bytes | None) -> Any:
    try:
        return json_data.loads(data) if data is not None else None
    except (ValueError, UnicodeDecodeError):
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


# ---- unpack ----
def _root_problem(error: OSError, root: Path) -> str:
    """What an OSError while writing under the root says about the root, with the fix."""
    where = f": {error.filename}" if error.filename else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"the cache root {root} has no space or no inodes left ({error.strerror}{where}); free space there "
                "or unpack under another root (--root)")
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"the cache root {root} cannot be written ({error.strerror}{where}); unpack under a writable root "
                "(--root), or make it writable")
    return f"cannot write under the cache root {root} ({error.strerror or error}{where})"


def _inside(path: Path, top: Path) -> None:
    """`RootError` unless `path`, resolved through any symlinks, lies under `top`: nothing is written elsewhere."""
    resolved, limit = path.resolve(), top.resolve()
    if resolved != limit and limit not in resolved.parents:
        raise RootError(top, f"{path} resolves to {resolved}, outside the cache root {limit}; remove that link")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # another user's process: alive
        return True
    return True


def _remove_abandoned(root: Path) -> None:
    """Staging and replaced-entry directories of unpacks that were killed (their process is gone)."""
    for path in root.glob(".vgc-*-*"):
        for prefix in (_STAGING, _REPLACED):
            pid = path.name[len(prefix):].partition("-")[0]
            if path.name.startswith(prefix) and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                logger.info("cache: removed %s, left by an unpack that was killed", path)


@contextlib.contextmanager
def _entry_locks(root: Path, hashes: list[str], wait_s: float):
    """Every entry's lock (`<root>/locks/entry-<hash>.lock`), taken before anything is installed. One that another
    process holds is waited for, with a warning naming it, for at most `wait_s` seconds: then `RootError`."""
    make_private_dirs(root / LOCK_DIR)
    held = []
    try:
        for entry_hash in hashes:
            path = root / LOCK_DIR / f"entry-{entry_hash}.lock"
            lock = FileLock(str(path))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                logger.warning("cache unpack: entry %s is locked by another process (%s); waiting up to %.0f s",
                               entry_hash, path, wait_s)
                try:
                    lock.acquire(timeout=wait_s)
                except Timeout:
                    raise RootError(root, f"entry {entry_hash}'s lock {path} was still held by another process "
                                          f"after {wait_s:.0f} s (another vgc cache unpack of this entry?); let it "
                                          "finish, then unpack again") from None
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


def unpack(path: Path, root: Path, *, lock_wait_s: float | None = None) -> dict[str, str]:
    """Install a bundle under `root`; returns what happened per entry ("installed"; "replaced": the entry there was
    damaged or lacked artifacts or traces the bundle has; "kept": an intact copy holding all of the bundle's was
    already there). Raises `BundleError` when the bundle is refused and `RootError` when the root cannot take it
    (an entry lock held longer than `lock_wait_s`, default `LOCK_WAIT_S`, included); nothing is installed then.
    The staging directory is removed on every exit; one left by a killed unpack is removed by the next."""
    root = Path(root)
    for directory in (root, root / CACHE_SUBDIR, root / INDUCTOR_SUBDIR):
        untrusted = untrusted_reason(directory) if directory.exists() else None
        if untrusted:
            raise RootError(root, f"{directory} {untrusted}; use a directory only you can write")
    try:
        make_private_dirs(root / CACHE_SUBDIR)
        _remove_abandoned(root)
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING}{os.getpid()}-", dir=root))
    except OSError as error:
        raise RootError(root, _root_problem(error, root)) from None
    try:
        try:
            bundle = check(path, into=staging)
        except _ExtractError as error:
            raise RootError(root, "the bundle cannot be extracted under the root: "
                            + _root_problem(error.error, root)) from None
        if bundle.problems:
            raise BundleError(path, bundle.problems)
        hashes = sorted(bundle.entries)
        for entry_hash in hashes:
            _inside(root / CACHE_SUBDIR / entry_hash, root)
        with _entry_locks(root, hashes, LOCK_WAIT_S if lock_wait_s is None else lock_wait_s):
            kernels = _kernel_moves(root, staging)
            outcome: dict[str, str] = {}
            try:
                for source, destination in kernels:   # first: an entry never starts without the kernels it came with
                    _move_kernel(source, destination)
                for entry_hash in hashes:
                    outcome[entry_hash] = _install_entry(root, staging, entry_hash)
            except OSError as error:
                raise RootError(root, _root_problem(error, root), outcome) from None
            return outcome
    except OSError as error:
        raise RootError(root, _root_problem(error, root)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _kernel_moves(root: Path, staging: Path) -> list[tuple[Path, Path]]:
    """(extracted file, its place under the root) for each of Inductor's kernel files in the bundle, every place
    checked to lie under the root's kernel cache before any is written."""
    kernels = staging / INDUCTOR_SUBDIR
    if not kernels.is_dir():
        return []
    make_private_dirs(root / INDUCTOR_SUBDIR)
    moves = [(source, root / source.relative_to(staging)) for source in sorted(kernels.rglob("*")) if source.is_file()]
    for _, destination in moves:
        _inside(destination.parent, root / INDUCTOR_SUBDIR)
    return moves


def _move_kernel(source: Path, destination: Path) -> None:
    """Kernels are named by a hash of their source: an intact one already there is as good and stays; a damaged
    one (or a directory in its place) is replaced."""
    if os.path.lexists(destination):
        if not (destination.is_dir() or recovery.file_problem(destination)):
            return
        _remove(destination)
    make_private_dirs(destination.parent)
    os.replace(source, destination)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _install_entry(root: Path, staging: Path, entry_hash: str) -> str:
    target, new = root / CACHE_SUBDIR / entry_hash, staging / CACHE_SUBDIR / entry_hash
    if not os.path.lexists(target):
        os.replace(new, target)
        return "installed"
    if target.is_dir() and not target.is_symlink() and not verify.verify_entry(inventory.Entry(target)):
        lacking = _lacking(target, new)
        if lacking is None:
            return "kept"
        logger.info("cache unpack: entry %s here lacks %s; replacing it with the bundle's", entry_hash, lacking)
    old = Path(tempfile.mkdtemp(prefix=f"{_REPLACED}{os.getpid()}-{entry_hash}-", dir=root))
    os.replace(target, old / entry_hash)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)
    return "replaced"


def _lacking(local: Path, bundled: Path) -> str | None:
    """What the bundle's copy of an entry holds that the intact copy here does not (a rank directory, an artifact,
    a saved trace), or None: a copy left partial by a start that was stopped must not win over a complete one."""
    for rank in sorted(p for p in bundled.iterdir() if p.is_dir()):
        here = local / rank.name
        if not here.is_dir():
            return f"rank directory {rank.name}"
        wanted = set(_index_records(rank)) - set(_index_records(here))
        if wanted:
            return f"{len(wanted)} artifact(s) of {rank.name}, e.g. {min(wanted)}"
        traces = [p.name for p in saved_trace_files_in(rank) if not (here / p.name).is_file()]
        if traces:
            return f"the saved trace {rank.name}/{traces[0]}"
    return None


def _index_records(rank_dir: Path) -> dict[str, Any]:
    try:
        index = json_data.loads((rank_dir / INDEX_FILE).read_bytes())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}
