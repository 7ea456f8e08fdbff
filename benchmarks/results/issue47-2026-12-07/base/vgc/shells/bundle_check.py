"""Checking a cache bundle before anything of it is installed (`vgc cache verify FILE`, `show FILE`, `unpack`):
the manifest as data, the tar whole, every member against the manifest's hash (each saved trace against its own,
each generated module against its name), each entry's index, kernel records and factors file against the
members, and each entry's environment against this machine. With `into`, the members are extracted there as they
are read, so an accepted bundle is read once.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgc.cache import json_data, kernel_hashes, saved_traces
from vgc.cache.keys import compiles, diff_factors, environment_factors
from vgc.cache.layout import (ARTIFACT_DIR, CACHE_SUBDIR, FACTORS_FILE, INDEX_FILE, make_private_dirs, TRACE_PREFIX,
                              TRACE_SUFFIX)
from vgc.cache.recovery import INDUCTOR_SUBDIR
from vgc.cache.store import bound_elsewhere, factors_problem, record_problem
from vgc.shells import bundle_manifest

MANIFEST_NAME = "manifest.json"
_MANIFEST_LIMIT = bundle_manifest.MAX_BYTES   # a manifest larger than this is not one vgc wrote
_CHUNK = 1 << 20


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
    that fails raises `ExtractError`: the root's problem, not the bundle's."""
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


class ExtractError(Exception):
    """Writing an extracted file failed (a full disk, a read-only root): the root's problem, not the bundle's."""

    def __init__(self, error: OSError):
        self.error = error
        super().__init__(error.strerror or str(error))


def _create(destination: Path):
    try:
        make_private_dirs(destination.parent)
        return open(destination, "xb")
    except OSError as error:
        raise ExtractError(error) from error


def _write_chunk(target, chunk: bytes) -> None:
    try:
        target.write(chunk)
    except OSError as error:
        raise ExtractError(error) from error


def _close(target) -> None:
    try:
        target.close()   # a full disk can refuse the buffered end of the file here
    except OSError as error:
        raise ExtractError(error) from error


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
        if not kernel_hashes.tracked(relative):
            continue   # a file Inductor rewrites in place, recorded by an older vgc
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
    `ExtractError`). `environment=False` skips the comparison with this machine (`vgc cache show` of a bundle made
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
