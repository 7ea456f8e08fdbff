"""vgc: a torch.compile backend that gives any PyTorch inference model vLLM's compilation strategy.

The public names load on first use: `import vgc` alone must not import torch (the `vgc` command's module lives
here, and `vgc --help` answers at once). The backend "vgc" is registered with torch at `import vgc` when torch is
already imported (`import torch, vgc`), else at the first use of a public name; an installed vgc is also found
through its `torch_dynamo_backends` entry point.
"""

import importlib
import sys

from vgc._version import __version__
from vgc import envs  # noqa: F401  (first: it records the user's settings before torch changes any)
from vgc import log as _log

_log.install_fallback_handler()

_PUBLIC = {"CompilationConfig": "vgc.config", "CUDAGraphMode": "vgc.config", "DynamicShapesConfig": "vgc.config",
           "DynamicShapesType": "vgc.config", "PieceBackend": "vgc.config", "counters": "vgc.counters",
           "VgcBackend": "vgc.backend", "vgc_backend": "vgc.backend", "CompileAfterWarmupError": "vgc.trace_once",
           "CompiledModel": "vgc.api", "compile": "vgc.api", "InputMismatchError": "vgc.capture.paths",
           "RankFailedError": "vgc.distributed"}

__all__ = [
    "CompilationConfig", "CUDAGraphMode", "DynamicShapesConfig", "DynamicShapesType", "PieceBackend", "VgcBackend",
    "CompileAfterWarmupError", "CompiledModel", "InputMismatchError", "RankFailedError", "compile", "counters",
    "__version__",
]


def _load() -> None:
    for name, module in _PUBLIC.items():
        globals()[name] = getattr(importlib.import_module(module), name)
    importlib.import_module("vgc._compat").register_backend_by_name("vgc", globals()["vgc_backend"])


def __getattr__(name: str):
    if name in _PUBLIC:
        _load()
        return globals()[name]
    try:   # a submodule read as an attribute (`vgc._compat`), as the eager import made them
        return importlib.import_module(f"vgc.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"vgc.{name}":
            raise
        raise AttributeError(f"module 'vgc' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


if "torch" in sys.modules:   # torch's import is paid already: `torch.compile(backend="vgc")` works right away
    _load()
