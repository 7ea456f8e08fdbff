"""vgc: a torch.compile backend that gives any PyTorch inference model vLLM's compilation strategy."""

from vgc._version import __version__

from vgc import envs  # noqa: E402,F401  (first: it records the user's settings before torch changes any)
from vgc.config import (CompilationConfig, CUDAGraphMode, DynamicShapesConfig, DynamicShapesType,  # noqa: E402
                        PieceBackend)
from vgc.counters import counters  # noqa: E402
from vgc.backend import VgcBackend, vgc_backend  # noqa: E402
from vgc.trace_once import CompileAfterWarmupError  # noqa: E402
from vgc.api import CompiledModel, compile  # noqa: E402
from vgc.capture.paths import InputMismatchError  # noqa: E402
from vgc.distributed import RankFailedError  # noqa: E402
from vgc import _compat  # noqa: E402
from vgc import log as _log  # noqa: E402

_compat.register_backend_by_name("vgc", vgc_backend)
_log.install_fallback_handler()

__all__ = [
    "CompilationConfig", "CUDAGraphMode", "DynamicShapesConfig", "DynamicShapesType", "PieceBackend", "VgcBackend",
    "CompileAfterWarmupError", "CompiledModel", "InputMismatchError", "RankFailedError", "compile", "counters",
    "__version__",
]
