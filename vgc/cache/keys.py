"""The factors that make up a cache key, each recorded so that a miss can be explained. No paths enter a key."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
from typing import Any, Iterable

import torch

from vgc import _compat

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
def _device_factors(device_type: str) -> dict[str, Any]:
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"device_name": props.name, "device_capability": f"{props.major}.{props.minor}",
                "cuda_version": torch.version.cuda, "triton_version": _triton_version()}
    # CPU kernels are C++ specialised for the vector ISA of the machine that generated them.
    return {"machine": platform.machine(), "cpu_vec_isa": _compat.cpu_vec_isa()}


def environment_factors(device_type: str) -> dict[str, Any]:
    """Versions and compiler settings that change generated code."""
    from vgc import __version__

    inductor = _compat.inductor_config_portable()
    functorch = _compat.functorch_config_portable()
    return {
        "vgc_version": __version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch_version": torch.__version__,
        "torch_build": _compat.torch_build_key(),
        "device_type": device_type,
        **_device_factors(device_type),
        "inductor_config": _digest(inductor),
        "functorch_config": _digest(functorch),
    }


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def source_factors(code_objects: Iterable) -> list[list[str]]:
    """[file name, content hash] of every traced source file outside torch (torch is keyed by its build)."""
    files = sorted({code.co_filename for code in code_objects})
    out = []
    for path in files:
        if not os.path.isfile(path) or os.path.abspath(path).startswith(_TORCH_DIR):
            continue
        out.append([os.path.basename(path), _file_digest(path)])
    return sorted(out)


def cache_key(config_factors: dict[str, Any], env_factors: dict[str, Any],
              sources: list[list[str]]) -> tuple[str, dict[str, Any]]:
    factors = {"config": config_factors, "environment": env_factors, "sources": sources}
    return _digest(factors, 20), factors
