"""Choose the cache entry (directory) for a graph from its key factors, or none when caching is off."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vgc import envs
from vgc.cache.inventory import CACHE_SUBDIR, closest_entry
from vgc.cache.keys import cache_key, environment_factors, source_factors, traced_source_files
from vgc.cache.store import ArtifactStore, NoStore, make_private_dirs
from vgc.config import CompilationConfig

logger = logging.getLogger("vgc")

# Inductor's own cache (compiled kernels, the CPU ISA probe) sets this variable itself on first use, so the
# user's choice can only be seen before that.
_USER_INDUCTOR_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def cache_enabled() -> bool:
    return not envs.disable_compile_cache()


def save_format(config: CompilationConfig) -> str:
    if config.compile_cache_save_format is not None:
        return config.compile_cache_save_format.value
    return envs.compile_cache_save_format() or "binary"


def cache_root(config: CompilationConfig) -> Path:
    return Path(config.cache_dir).expanduser() if config.cache_dir else envs.cache_root()


def rank_dir_name() -> str:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    raw = os.environ.get("VGC_DP_RANK", "0")
    if not raw.isdigit():
        raise ValueError(f"VGC_DP_RANK={raw!r} must be a non-negative integer (the data-parallel rank)")
    dp = int(raw)
    return f"rank_{rank}_{dp}"


def _use_inductor_cache_under(root: Path) -> None:
    """Keep Inductor's kernel cache beside vgc's artifacts so that copying the root copies built kernels too."""
    if _USER_INDUCTOR_CACHE_DIR is None:
        make_private_dirs(root / "inductor_cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor_cache")


def explain_new_entry(root: Path, key: str, factors: dict) -> None:
    """On a miss, name what differs from the closest existing entry: a silent miss costs a full compile."""
    nearest = closest_entry(root, factors)
    if nearest is None:
        logger.info("cache miss: no entry under %s yet; compiling", root / CACHE_SUBDIR)
        return
    entry, differences = nearest
    logger.info("cache miss for %s; closest entry %s differs in: %s", key, entry.hash, "; ".join(differences))


def open_store(config: CompilationConfig, device_type: str, code_objects) -> ArtifactStore | NoStore:
    if not cache_enabled():
        return NoStore()
    fmt = save_format(config)
    root = cache_root(config)
    _use_inductor_cache_under(root)   # first: computing the key already probes the CPU ISA into Inductor's cache
    paths = traced_source_files(code_objects)
    key, factors = cache_key(config.hash_factors(), environment_factors(device_type), source_factors(paths))
    directory = root / CACHE_SUBDIR / key / rank_dir_name()
    if not directory.exists():
        explain_new_entry(root, key, factors)
    store = ArtifactStore(directory, fmt)
    # Paths are kept beside the key (never in it) so that `vgc cache why-miss` can re-hash the sources.
    store.write_factors({"hash": key, "factors": factors, "source_paths": paths})
    logger.info("using cache directory %s", directory)
    return store
