"""Saved traces: the program Dynamo captured for a `vgc.compile` model, kept in its cache entry beside the
artifacts, so that a warm start loads it instead of tracing.

A trace file is `trace-<identity>.bin` in a rank directory. The identity names the model's forward and the input
contract it was traced for (argument kinds, dtypes, static sizes, dynamic dims, shape mode); the entry it lies in
is keyed, like every entry, by the config, the environment and the contents of every source file the trace read.
A start finds the files of its identity, re-hashes the sources each entry recorded, and uses only a file whose
entry key still matches: an edited model, another config or another torch is a miss, as for artifacts.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vgc.cache import json_data
from vgc.cache.entry import entry_key, rank_dir_name, untrusted_entry
from vgc.cache.keys import module_source_files
from vgc.cache.layout import atomic_write, CACHE_SUBDIR, FACTORS_FILE, trace_file_name
from vgc.config import CompilationConfig

logger = logging.getLogger("vgc")

MAGIC = b"vgc saved trace 2\n"
_UNBOUND = b"vgc saved trace 1\n"   # before traces were bound to their entry: only stale entries hold these


def _binding(entry: str, rank: str) -> bytes:
    """What a trace's content hash covers besides the program: its entry and rank directory. Two entries of one
    model hold traces of the same name (another config, other sizes); swapped, each would pass a hash of its
    program alone and load the other config's plan."""
    return f"{entry}/{rank}\n".encode()


def _where(path: Path) -> bytes:
    return _binding(path.parent.parent.name, path.parent.name)


class DamagedTrace(ValueError):
    """A trace file that is not whole: its header or content hash is wrong."""


def identity(forward: Callable, contract: Any) -> str:
    """16 hex digits naming a model's forward (its qualified name, the class of the model it is bound to, where its
    code is) and the input contract it is traced for (`contract`: any value with a stable repr, e.g. the argument
    specs, dynamic dims and shape mode)."""
    name = f"{getattr(forward, '__module__', '?')}.{getattr(forward, '__qualname__', repr(forward))}"
    owner = getattr(forward, "__self__", None)   # a subclass that inherits forward is another program
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    where = (os.path.basename(code.co_filename), code.co_firstlineno) if code is not None else None
    closure = closure_identity(getattr(forward, "__func__", forward))
    return hashlib.sha256(repr((name, type(owner).__qualname__, type(owner).__module__, where,
                                contract) + ((closure,) if closure else ())).encode()).hexdigest()[:16]


# What a forward's closure may hold for a saved trace to serve it: the functions a decorator wraps (transformers'
# `can_return_tuple`, `check_model_inputs`), and constants; their names and values enter the trace's identity.
_CONSTANTS = (bool, int, float, str, bytes, type(None))
_DEPTH = 8


def _cells(function):
    code = getattr(function, "__code__", None)   # a callable object has no closure of its own
    for name, cell in zip(code.co_freevars if code else (), getattr(function, "__closure__", None) or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:   # an empty cell: a name the function would read before it is bound
            yield name, cell


def closure_problem(function, depth: int = 0, wrappers_ok: bool = False) -> str | None:
    """Why a forward's closure stops a saved trace from serving it (a captured tensor, module or dict: values a
    later process may hold otherwise, which the trace baked in), or None. `wrappers_ok`: a decorator's wrapper is
    no problem (the trace goes through `trace_once.call_forward`), only what the closures hold."""
    for name, value in _cells(function):
        if inspect.isfunction(value) and depth < _DEPTH:
            if not wrappers_ok and not _named(value):
                code = function.__code__
                return (f"its forward is a decorator's wrapper ({code.co_name} in "
                        f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}) around {value.__qualname__}, "
                        f"which torch saves by name, and {value.__module__}.{value.__qualname__} names the wrapper")
            problem = closure_problem(value, depth + 1, wrappers_ok)
            if problem:
                return problem
        elif not isinstance(value, _CONSTANTS) and not (isinstance(value, tuple) and
                                                        all(isinstance(v, _CONSTANTS) for v in value)):
            return (f"its forward ({function.__qualname__}) is a closure over {name!r}, a {type(value).__name__}, "
                    "whose value a saved trace could not check in a later process")
    return None


def _named(function) -> bool:
    """Whether `function` is what its module and qualified name find (how pickle saves a function)."""
    import importlib

    try:
        found = importlib.import_module(function.__module__)
        for part in function.__qualname__.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, TypeError):
        return False
    return found is function


def closure_identity(function, depth: int = 0) -> tuple:
    """The wrapped functions (by name and code location) and constants of a forward's closure."""
    out = []
    for name, value in _cells(function):
        if inspect.isfunction(value) and depth < _DEPTH:
            code = value.__code__
            out.append((name, value.__module__, value.__qualname__, os.path.basename(code.co_filename),
                        code.co_firstlineno, closure_identity(value, depth + 1)))
        else:
            out.append((name, repr(value)))
    return tuple(out)


@dataclass
class Found:
    path: Path                 # the trace file
    entry: str                 # its entry's key
    source_paths: list[str]    # the files the trace read, as this process finds them
    source_modules: list[str]  # their modules' names ([] for an entry that recorded paths only)
    extra_paths: list[str]     # the files among them that no module names
    factors: dict              # the entry key's factors, as computed to find it (`open_store` reuses them)


def find(root: Path, config: CompilationConfig, device_type: str, trace_identity: str) -> tuple[Found | None,
                                                                                                  list[str]]:
    """The usable saved trace of this identity under `root`, newest first, and why each other one is not."""
    reasons = []
    rank = rank_dir_name()
    name = trace_file_name(trace_identity)
    try:
        # lexists, not glob's exists(): a looping symlink in the trace's place must be found (and reported when it
        # cannot be read), not skipped so that the start traces again without a word of the damage
        candidates = sorted((rank_dir / name for rank_dir in (root / CACHE_SUBDIR).glob(f"*/{rank}")
                             if os.path.lexists(rank_dir / name)), key=_modified, reverse=True)
    except OSError as e:
        return None, [f"cannot list {root / CACHE_SUBDIR} ({e.strerror or e})"]
    for path in candidates:
        entry = path.parent.parent.name
        sources = current_sources(path.parent)
        problem, factors = (sources, None) if isinstance(sources, str) else \
            _stale_reason(entry, config, device_type, sources[0])
        if problem is None:
            untrusted = untrusted_entry(root, entry)
            if untrusted is None:
                return Found(path, entry, *sources, factors), reasons
            problem = f"{untrusted[0]} {untrusted[1]}"
        reasons.append(f"{path}: {problem}")
    return None, reasons


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:   # a looping symlink in the trace's place: read() reports it
        return 0.0


def current_sources(rank_dir: Path) -> tuple[list[str], list[str], list[str]] | str:
    """(files, module names, files no module names) the entry's trace read, as this process finds them: each traced
    module's file as imported now (an edited copy elsewhere counts, not the file the trace read), plus the
    recorded files of code no module names; for an entry without module names, the recorded paths. A string says
    why they cannot be found."""
    try:
        manifest = json_data.loads((rank_dir / FACTORS_FILE).read_bytes())
        paths, modules = manifest.get("source_paths"), manifest.get("source_modules")
        extra = manifest.get("source_extra_paths", [])
    except (OSError, ValueError, AttributeError):
        return f"{FACTORS_FILE} is missing or damaged, so the trace's sources cannot be checked"
    if _strings(modules) and _strings(extra):
        found = module_source_files(modules)
        if found is None:
            return "a module the trace read is not imported in this process"
        paths = sorted(set(found) | set(extra))
    elif _strings(paths):
        modules, extra = [], paths
    else:
        return f"{FACTORS_FILE} records no source files"
    gone = [p for p in extra if not os.path.isfile(p)]
    return f"the traced source file {gone[0]} is gone" if gone else (paths, modules, extra)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _stale_reason(entry: str, config: CompilationConfig, device_type: str,
                  paths: list[str]) -> tuple[str | None, dict | None]:
    """Why a trace saved in `entry` no longer describes the current program (None: it still does), and the
    current key's factors."""
    try:
        key, factors = entry_key(config, device_type, paths)
    except OSError as e:   # a file removed or unreadable since it was found
        return f"a traced source file cannot be read ({e.strerror or e})", None
    if key != entry:
        return (f"its entry key is now {key}: a traced source file, the config or the environment changed "
                "(`vgc cache why-miss --entry` names which)"), factors
    return None, factors


def read(path: Path) -> bytes:
    """The program bytes of a trace file; `DamagedTrace` when the file is cut short or altered, or was written for
    another entry or rank (moved or swapped)."""
    data = path.read_bytes()
    bound = data.startswith(MAGIC)
    if not bound and not data.startswith(_UNBOUND):
        raise DamagedTrace(f"{path} does not start with vgc's trace header")
    digest, _, payload = data[len(MAGIC):].partition(b"\n")
    if hashlib.sha256((_where(path) if bound else b"") + payload).hexdigest().encode() != digest:
        raise DamagedTrace(f"{path} fails its content hash (cut short, altered, or moved here from another entry)")
    return payload


class StreamCheck:
    """`problem()` of a trace file read in chunks (a bundle's member: `torch_compile_cache/<entry>/<rank>/
    trace-*.bin`), without holding it whole."""

    _HEAD = len(MAGIC) + 65   # the header, the hex digest and its newline

    def __init__(self, entry: str, rank: str):
        self._head, self._payload, self._digest = b"", hashlib.sha256(_binding(entry, rank)), None

    def update(self, chunk: bytes) -> None:
        if self._digest is not None:
            self._payload.update(chunk)
            return
        self._head += chunk
        if len(self._head) >= self._HEAD:
            self._digest, rest = self._head[:self._HEAD], self._head[self._HEAD:]
            self._payload.update(rest)

    def problem(self) -> str | None:
        head = self._digest if self._digest is not None else self._head
        if not head.startswith(MAGIC):   # an unbound trace lies only in an older vgc's entry, refused here anyway
            return "does not start with vgc's trace header"
        if self._digest is None or self._digest[-1:] != b"\n" or \
                self._payload.hexdigest().encode() != self._digest[len(MAGIC):-1]:
            return "fails its content hash (cut short, altered, or moved here from another entry)"
        return None


def problem(path: Path) -> str | None:
    """What is wrong with a trace file, for `vgc cache verify`; None when it is whole."""
    try:
        read(path)
    except DamagedTrace as e:
        return str(e).replace(f"{path} ", "", 1)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    return None


def save(directory: Path, trace_identity: str, program: bytes) -> Path:
    path = directory / trace_file_name(trace_identity)
    digest = hashlib.sha256(_where(path) + program).hexdigest().encode()
    atomic_write(path, MAGIC + digest + b"\n" + program)
    return path
