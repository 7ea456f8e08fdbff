"""The factors that make up a cache key, each recorded so that a miss can be explained. No paths enter a key."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from vgc import _compat
from vgc._version import __version__
from vgc.cache.cpu_isa import remember_cpu_isa_probes
from vgc.cache.layout import atomic_write, make_private_dirs
from vgc.distributed import rank_and_size

_TORCH_DIR = os.path.dirname(torch.__file__)


def _digest(obj: Any, length: int = 16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()[:length]


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


@functools.cache
def _device_factors(device_type: str, compiles: bool) -> dict[str, Any]:
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"device_name": props.name, "device_capability": f"{props.major}.{props.minor}",
                "cuda_version": torch.version.cuda, "triton_version": _triton_version()}
    # CPU kernels are C++ specialised for the vector ISA of the machine that generated them (found by building
    # probe programs: seconds on a fresh machine, not spent where no piece is compiled; a probe that passed once
    # on this machine is remembered, for `vgc cache verify FILE`, `unpack` and `why-miss` as for a start).
    if compiles:
        remember_cpu_isa_probes()
    return {"machine": platform.machine(), **({"cpu_vec_isa": _compat.cpu_vec_isa()} if compiles else {})}


def compiles(config_factors: dict[str, Any]) -> bool:
    """Whether an entry of these config factors holds Inductor's code (not for `piece_backend="eager"`)."""
    return config_factors.get("piece_backend", "inductor") != "eager"


TORCH_KEYS_DIR = "torch_keys"   # <root>/torch_keys/<signature of torch's files>: Inductor's hash of them
TRITON_KEYS_DIR = "triton_keys"   # <root>/triton_keys/<signature of Triton's files>: Triton's hash of them


def _files_signature(directory: str, version: str = torch.__version__ + (torch.version.git_version or "")) -> str:
    """A digest of the name, size and modification time of every Python and extension module under `directory`
    (a superset of what Inductor's torch hash, or Triton's, reads), its path and the package's `version`: any file
    replaced, edited or added changes it. Stat calls only: about 20 ms for a torch install, against 0.1-0.7 s to
    read it all."""
    h = hashlib.sha256(repr((version, directory)).encode())
    for dirpath, dirnames, files in os.walk(directory):
        dirnames.sort()
        inside = os.path.relpath(dirpath, directory)   # once a directory: a third of the time, per file
        lines = []
        for name in sorted(files):
            if name.endswith((".py", ".so", ".pyd", ".cpp", ".ld")):
                info = os.stat(os.path.join(dirpath, name))
                lines.append(f"{inside}{os.sep}{name}\0{info.st_size}\0{info.st_mtime_ns}\n")
        h.update("".join(lines).encode())
    return h.hexdigest()[:32]


def _remember(path: Path, value_of: Callable[[str | None], str | None], valid: Callable[[str], bool]) -> None:
    """`value_of(the text an earlier process recorded at path)` (None when there is none, or it is unreadable,
    damaged or not `valid`), recorded there when it returns another. A record carries a check of its text and its
    name, so a damaged one is never taken for a value; a root that cannot be written leaves each process
    computing the value, as without a record."""
    def record(value: str) -> bytes:
        return f"{value} {hashlib.sha256((value + path.name).encode()).hexdigest()[:16]}".encode()
    try:
        text = path.read_bytes()
        known = text.split()[0].decode()
        known = known if record(known) == text and valid(known) else None
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        known = None
    value = value_of(known)
    if value is not None and value != known:
        try:
            make_private_dirs(path.parent)
            atomic_write(path, record(value))
        except OSError:
            pass


def _is_hex_of(length: int) -> Callable[[str], bool]:
    def valid(text: str) -> bool:
        try:
            return len(bytes.fromhex(text)) == length
        except ValueError:
            return False
    return valid


@functools.cache
def remember_torch_build_key(root: Path) -> None:
    """Inductor's hash of torch's sources, remembered under `root` by a signature of those files, so that the next
    process hands it to Inductor instead of reading every torch module again (0.3-0.7 s of a warm start on a GPU
    host)."""
    _remember(root / TORCH_KEYS_DIR / _files_signature(_TORCH_DIR),
              lambda known: _compat.torch_source_key(None if known is None else bytes.fromhex(known)).hex(),
              _is_hex_of(32))


@functools.cache
def remember_triton_key(root: Path) -> None:
    """Triton's hash of its compiler's sources and its library, remembered under `root` by a signature of those
    files. Triton computes it in every process before it compiles or loads its first kernel, and Inductor on every
    artifact it loads for a GPU (for its autotuning cache's key, unused unless that cache is remote): it reads the
    ~400 MB libtriton, 0.2-0.4 s of a warm start on a GPU host. The next process's Triton and Inductor are answered
    with the recorded value."""
    try:
        import triton
    except ImportError:
        return
    signature = _files_signature(os.path.dirname(triton.__file__), triton.__version__)
    _remember(root / TRITON_KEYS_DIR / signature, _compat.triton_source_key,
              lambda text: text.startswith(triton.__version__) and len(text) > 64)


@functools.cache
def vgc_source_digest() -> str:
    """vgc's own code shapes the pieces it hands to Inductor: any change to it is a new cache entry."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(package)):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, package).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


def environment_factors(device_type: str, compiles: bool = True) -> dict[str, Any]:
    """Versions and compiler settings that change generated code (`compiles`: Inductor generates some)."""
    inductor = _compat.inductor_config_portable()
    functorch = _compat.functorch_config_portable()
    return {
        "vgc_version": __version__,
        "vgc_source": vgc_source_digest(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch_version": torch.__version__,
        "torch_build": _compat.torch_build_key(),
        "device_type": device_type,
        **_device_factors(device_type, compiles),
        # a tensor-parallel shard's code depends on how many ranks share the model; its rank only picks the
        # directory (rank_<r>_<dp>/), since every rank compiles the same code
        "world_size": rank_and_size()[1],
        "inductor_config": _digest(inductor),
        "functorch_config": _digest(functorch),
        "inductor_custom_passes": {name: pass_identity(value)
                                   for name, value in _compat.inductor_custom_passes().items()},
    }


def pass_identity(graph_pass: Any) -> str:
    """A pass's identity for the key: its `uuid()` (torch's CustomGraphPass contract) when it has one, else its
    qualified name and a digest of its source, so that editing the pass changes the key."""
    if isinstance(graph_pass, (list, tuple)):
        return "[" + ", ".join(pass_identity(p) for p in graph_pass) + "]"
    uuid = getattr(graph_pass, "uuid", None)
    if callable(uuid):
        value = uuid()
        if value is not None:
            return str(value)
    target = graph_pass if inspect.isfunction(graph_pass) or inspect.isclass(graph_pass) else type(graph_pass)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        return name   # no source to read (a builtin, a lambda in a REPL): its name is all the key can hold
    return f"{name}:{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def traced_source_files(code_objects: Iterable) -> list[str]:
    """Absolute paths of the traced source files outside torch (torch itself is keyed by its build)."""
    return user_source_files(code.co_filename for code in code_objects)


def user_source_files(paths: Iterable[str]) -> list[str]:
    """The paths that are existing files outside torch, absolute, sorted, once each."""
    files = {os.path.abspath(p) for p in paths}
    return sorted(p for p in files if os.path.isfile(p) and not p.startswith(_TORCH_DIR + os.sep))


def module_source_files(module_names: Iterable[str]) -> list[str] | None:
    """`traced_source_files` for a program that names the modules it traced; None when one of them has no file
    (it cannot be hashed, so the program cannot be keyed)."""
    import sys

    paths = set()
    for name in module_names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path is None:
            return None
        paths.add(os.path.abspath(path))
    return sorted(p for p in paths if not p.startswith(_TORCH_DIR + os.sep))


def source_factors(paths: Iterable[str]) -> list[list[str]]:
    """[file name, content hash] per traced file: contents, never paths, enter the key."""
    return sorted([os.path.basename(p), _file_digest(p)] for p in paths)


def cache_key(config_factors: dict[str, Any], env_factors: dict[str, Any],
              sources: list[list[str]]) -> tuple[str, dict[str, Any]]:
    factors = {"config": config_factors, "environment": env_factors, "sources": sources}
    return _digest(factors, 20), factors


def flatten_factors(factors: dict[str, Any]) -> dict[str, Any]:
    """{'config.compile_sizes': [...], 'sources.llama.py': '<hash>', ...} for comparing two entries."""
    flat: dict[str, Any] = {}
    for section, value in factors.items():
        if section == "sources":
            for i, (name, digest) in enumerate(value):
                flat[f"sources.{name}" if f"sources.{name}" not in flat else f"sources.{name}#{i}"] = digest
        elif isinstance(value, dict):
            for k, v in value.items():
                flat[f"{section}.{k}"] = v
        else:
            flat[section] = value
    return flat


def diff_factors(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences, one per factor, from a stored entry to the current environment."""
    a, b = flatten_factors(stored), flatten_factors(current)
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in a:
            out.append(f"{name}: not in the cached entry (now {b[name]!r})")
        elif name not in b:
            out.append(f"{name}: no longer present (was {a[name]!r})")
        elif a[name] != b[name]:
            out.append(f"{name}: {a[name]!r} -> {b[name]!r}")
    return out
