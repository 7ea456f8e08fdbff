"""Environment variables vgc reads. `VGC_*` names win over their `VLLM_*` aliases; bad values are errors."""

from __future__ import annotations

import os
from pathlib import Path

# Inductor sets this variable itself on first use (importing parts of Dynamo is enough), so the user's own choice
# can only be seen before vgc imports torch's compiler: `vgc/__init__.py` imports this module first.
USER_INDUCTOR_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _lookup(name: str) -> tuple[str, str] | None:
    """Return (variable name, value) for VGC_<name>, else VLLM_<name>, else None."""
    for prefix in ("VGC_", "VLLM_"):
        var = prefix + name
        if var in os.environ:
            return var, os.environ[var]
    return None


def _flag(name: str, default: bool = False) -> bool:
    found = _lookup(name)
    if found is None:
        return default
    var, raw = found
    value = raw.strip().lower()
    if not value:   # set but empty: as if unset, so that `VAR=` never turns a default-on check off
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{var}={raw!r} is not a boolean; use 1 or 0")


def disable_compile_cache() -> bool:
    return _flag("DISABLE_COMPILE_CACHE")


def check_input_ids() -> bool:
    """Check token ids against embedding tables before each compiled call (on unless VGC_CHECK_INPUT_IDS=0):
    an out-of-range id aborts the compiled CPU kernel's process instead of raising as eager does."""
    return _flag("CHECK_INPUT_IDS", default=True)


def compile_cache_save_format() -> str | None:
    found = _lookup("COMPILE_CACHE_SAVE_FORMAT")
    if found is None:
        return None
    var, raw = found
    value = raw.strip().lower()
    if value not in ("binary", "unpacked"):
        raise ValueError(f"{var}={raw!r} is not a cache format; use 'binary' or 'unpacked'")
    return value


def cache_trust_any() -> bool:
    """`VGC_CACHE_TRUST=any`: load from cache directories that are another user's or writable by others."""
    raw = os.environ.get("VGC_CACHE_TRUST", "")
    value = raw.strip().lower()
    if value not in ("", "any", "owner"):
        raise ValueError(f"VGC_CACHE_TRUST={raw!r} is not a trust level; use 'any' (or leave it unset)")
    return value == "any"


def cache_root() -> Path:
    root = os.environ.get("VGC_CACHE_ROOT")
    if root:
        return Path(root).expanduser()
    return Path.home() / ".cache" / "vgc"


def debug_dump_path() -> str | None:
    """VGC_DEBUG_DUMP_PATH (alias VLLM_DEBUG_DUMP_PATH): a directory where graph passes write each piece's graph
    before and after every pass; unset or empty: no dumps."""
    found = _lookup("DEBUG_DUMP_PATH")
    return found[1] or None if found else None


def skinny_mm_on_cpu() -> bool:
    """VGC_SKINNY_MM_ON_CPU=1 (tests): the `skinny_matmuls` pass also rewrites CPU pieces, and `vgc::skinny_mm`
    runs its Triton kernel on CPU tensors when Triton's interpreter is on (TRITON_INTERPRET=1), else torch.mm."""
    return _flag("SKINNY_MM_ON_CPU")


def pdl() -> bool:
    """VGC_PDL (default 1): vgc's own matmul kernel launches as a programmatic dependent of the kernel before it on
    Hopper and later GPUs (its weight reads start while that kernel finishes); 0: ordinary launches."""
    return _flag("PDL", default=True)


def load_without_compiler() -> bool:
    """VGC_LOAD_WITHOUT_COMPILER (default 1): a saved artifact loads with Inductor's compiler modules stood in for
    (`vgc/_compat/inductor_load.py`), so a warm start does not import them; 0: torch's ordinary load."""
    return _flag("LOAD_WITHOUT_COMPILER", default=True)


def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton kernels run in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "").strip() == "1"
