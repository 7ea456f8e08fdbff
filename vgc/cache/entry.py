"""Choose the cache entry (directory) for a graph from its key factors, or none when caching is off."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vgc import envs
from vgc.cache import recovery
from vgc.cache.cpu_isa import remember_cpu_isa_probes
from vgc.cache.inventory import closest_entry
from vgc.cache.keys import (
    cache_key, compiles, environment_factors, remember_torch_build_key, remember_triton_key, source_factors)
from vgc.cache.layout import CACHE_SUBDIR, make_private_dirs, NOT_A_DIRECTORY, untrusted_reason
from vgc.cache.recovery import INDUCTOR_SUBDIR
from vgc.cache.store import ArtifactStore, NoStore, Store
from vgc.config import CompilationConfig
from vgc.distributed import rank_and_size
from vgc.log import warn_once

logger = logging.getLogger("vgc")

# Inductor's own cache (compiled kernels, the CPU ISA probe): where the user put it, if they did.
_USER_INDUCTOR_CACHE_DIR = envs.USER_INDUCTOR_CACHE_DIR


def cache_enabled() -> bool:
    return not envs.disable_compile_cache()


def save_format(config: CompilationConfig) -> str:
    if config.compile_cache_save_format is not None:
        return config.compile_cache_save_format.value
    return envs.compile_cache_save_format() or "binary"


def cache_root(config: CompilationConfig) -> Path:
    return Path(config.cache_dir).expanduser() if config.cache_dir else envs.cache_root()


def rank_dir_name() -> str:
    rank, _ = rank_and_size()
    raw = os.environ.get("VGC_DP_RANK", "0")
    if not raw.isdigit():
        raise ValueError(f"VGC_DP_RANK={raw!r} must be a non-negative integer (the data-parallel rank)")
    dp = int(raw)
    return f"rank_{rank}_{dp}"


def _root_source(config: CompilationConfig) -> str:
    """Where the cache root came from, as the user would set it: named in every error about the root."""
    if config.cache_dir:
        return f"CompilationConfig.cache_dir={config.cache_dir!r}"
    if os.environ.get("VGC_CACHE_ROOT"):
        return f"VGC_CACHE_ROOT={os.environ['VGC_CACHE_ROOT']!r}"
    return f"the default cache root {str(envs.cache_root())!r} (set VGC_CACHE_ROOT to choose another)"


def _fix(reason: str, trust_fix: str) -> str:
    """A file where a cache directory belongs is not a trust question: no trust setting can help."""
    return "point the cache root (VGC_CACHE_ROOT or cache_dir) at a directory" if reason == NOT_A_DIRECTORY \
        else trust_fix


def _trust_problem(paths: list[Path]) -> tuple[Path, str] | None:
    if envs.cache_trust_any():
        return None
    for path in paths:
        reason = untrusted_reason(path)
        if reason:
            return path, reason
    return None


def _use_inductor_cache_under(root: Path) -> Path | None:
    """Keep Inductor's kernel cache beside vgc's artifacts so that copying the root copies built kernels too.
    Returns the root when Inductor's cache is there (vgc then repairs damage in it), else None."""
    if _USER_INDUCTOR_CACHE_DIR is not None:
        return None
    make_private_dirs(root / INDUCTOR_SUBDIR)
    # a read-only root (a deployment's image) or a full one: Inductor writes and locks files in its cache even to
    # load an artifact, so it works in a private directory (one per root and process); vgc's artifacts still load
    unwritable = "it is read-only" if not os.access(root / INDUCTOR_SUBDIR, os.W_OK) else recovery.full_disk(root)
    if unwritable is not None or recovery.moved_off(root):
        recovery.move_kernel_cache_off(root, unwritable or "a write failed earlier")
        return None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / INDUCTOR_SUBDIR)
    return root


def explain_new_entry(root: Path, key: str, factors: dict) -> None:
    """On a miss, name what differs from the closest existing entry: a silent miss costs a full compile."""
    nearest = closest_entry(root, factors)
    if nearest is None:
        logger.info("cache miss: no entry under %s yet; compiling", root / CACHE_SUBDIR)
        return
    entry, differences = nearest
    logger.info("cache miss for %s; closest entry %s differs in: %s", key, entry.hash, "; ".join(differences))


_prepared_roots: set[Path] = set()


def open_root(config: CompilationConfig) -> Path | None:
    """The cache root, trusted and ready (Inductor's cache under it, damaged kernels removed, once per process),
    or None (with one warning) when it is off, unusable or untrusted."""
    if not cache_enabled():
        return None
    root = cache_root(config)
    untrusted = _trust_problem([root, root / CACHE_SUBDIR, root / INDUCTOR_SUBDIR])
    if untrusted:
        _cache_off(config, f"{untrusted[0]} {untrusted[1]}",
                   _fix(untrusted[1], "use a directory only you can write, or set VGC_CACHE_TRUST=any to load from "
                        "it anyway"))
        return None
    try:
        # first: computing the key already probes the CPU ISA into Inductor's cache
        kernel_root = _use_inductor_cache_under(root)
        remember_cpu_isa_probes()
        if kernel_root is not None and kernel_root not in _prepared_roots:
            # a kernel half-written by a killed compile fails every later start; once per process is enough
            recovery.remove_damaged_kernels(kernel_root)
            _prepared_roots.add(kernel_root)
    except OSError as e:
        _cache_off(config, f"{root} cannot hold the cache ({e.strerror or e})", "point it at a writable directory")
        return None
    return root


def entry_key(config: CompilationConfig, device_type: str, paths: list[str]) -> tuple[str, dict]:
    """The entry a model whose trace read the source files `paths` uses, and the factors of its key."""
    factors = config.hash_factors()
    root = cache_root(config)
    if root.is_dir():
        _remember_hashes(root, device_type)
    return cache_key(factors, environment_factors(device_type, compiles(factors)), source_factors(paths))


def _remember_hashes(root: Path, device_type: str) -> None:
    """The hashes of installed code the next process would compute again (torch's; Triton's, for a GPU), recorded
    under the root, or handed over from there: a cold start records them once its root exists."""
    remember_torch_build_key(root)
    if device_type == "cuda":
        remember_triton_key(root)


def records_root(config: CompilationConfig) -> Path | None:
    """Where a process that starts another (a tiered start's compile) records the installed code's hashes for it
    ahead of its own open: the cache root, unless caching is off or the root is untrusted (the other process
    would not load from it, and nothing is written there)."""
    if not cache_enabled():
        return None
    root = cache_root(config)
    return None if _trust_problem([root]) else root


def untrusted_entry(root: Path, key: str) -> tuple[Path, str] | None:
    return _trust_problem([root / CACHE_SUBDIR / key, root / CACHE_SUBDIR / key / rank_dir_name()])


def open_store(config: CompilationConfig, device_type: str, paths: list[str], modules: list[str] | None = None,
               extra_paths: list[str] | None = None, key: tuple[str, dict] | None = None) -> Store:
    """The cache entry for a graph that traced the source files `paths`; `NoStore` (compile, save nothing) when
    the cache is off, or when the root is unusable or untrusted, with one warning that names the root's setting
    and the fix. `modules` (the traced modules' names) lets a saved trace find their files in a later process;
    `extra_paths` are the files among `paths` that no module names (code Python did not import as a module).
    `key` is the entry's (key, factors) when the caller has just computed them (a found saved trace): hashing
    every source file again would only repeat that work."""
    root = open_root(config)
    if root is None:
        return NoStore()
    _remember_hashes(root, device_type)
    fmt = save_format(config)
    kernel_root = root if _USER_INDUCTOR_CACHE_DIR is None else None
    key, factors = key if key is not None else entry_key(config, device_type, paths)
    directory = root / CACHE_SUBDIR / key / rank_dir_name()
    untrusted = untrusted_entry(root, key)
    if untrusted:
        _cache_off(config, f"{untrusted[0]} {untrusted[1]}",
                   _fix(untrusted[1], "remove that entry, or set VGC_CACHE_TRUST=any to load from it anyway"))
        return NoStore()
    private_kernels = recovery.moved_off(root)
    if private_kernels is not None:
        # the root cannot take writes (warned once when Inductor's cache moved off it): what is there loads, as
        # through `vgc cache`'s read-only view, and nothing is created, repaired or saved
        if not directory.is_dir():
            return NoStore()
        logger.info("using cache directory %s (read only)", directory)
        return ArtifactStore(directory, fmt, create=False, kernels=Path(private_kernels))
    if not directory.exists():
        explain_new_entry(root, key, factors)
    try:
        store = ArtifactStore(directory, fmt, kernel_root=kernel_root)
    except OSError as e:
        _cache_off(config, f"{directory} cannot be created ({e.strerror or e})",
                   "point it at a writable directory with free space")
        return NoStore()
    try:
        # Paths are kept beside the key (never in it) so that `vgc cache why-miss` can re-hash the sources.
        manifest = {"hash": key, "factors": factors, "source_paths": paths}
        if modules is not None:
            manifest.update(source_modules=modules, source_extra_paths=extra_paths or [])
        store.write_factors(manifest)
    except OSError as e:
        store.saving = False
        warn_once(f"factors:{directory}", "cache: cannot write under %s (%s); loading what is there, saving nothing",
                  directory, e.strerror or e)
    logger.info("using cache directory %s", directory)
    return store


def _cache_off(config: CompilationConfig, problem: str, fix: str) -> None:
    warn_once(f"root:{problem}", "compile cache off for this process: %s (cache root from %s); %s", problem,
              _root_source(config), fix)
