"""Loading a saved Inductor artifact without importing Inductor's compiler (private `torch._inductor`).

A warm start needs the code an artifact holds and the runtime its kernels call, not the compiler that wrote them.
Torch's load imports the compiler anyway, for six names:
- `CompiledArtifact.load` builds its keyword dict with a TypedDict from `compile_fx`;
- the cached graph's pickle names `decomposition.select_decomp_table` (kept for a recompile, not called to run);
- a cache hit imports `graph` to test `GraphLowering.save_output_code`, a hook only tests set;
- the code Inductor generated imports `extern_kernels` from `select_algorithm`, and `_align` from
  `codegen.memory_planning`;
- the compiled graph's call reads `torch._inductor.debug.RECORD_GRAPH_EXECUTION`.
Importing those modules builds the lowering tables, the templates and the scheduler: about 0.8 s of a 1.2 s warm
`warmup()` on a 2-core CPU, and seconds on an image that compiles torch's sources in every process.

`deferred_compiler()` stands in for each of those modules that is not imported yet, while one thread loads an
artifact. A stand-in answers only the names above, only to that thread, and only to torch's loading code and the
generated code; any other name, thread or caller gets the real module (imported then, and kept). The stand-ins
leave `sys.modules` when the load ends, so a later compile imports the real modules as usual.

`extern_kernels` answers each name the compiling process found to be the torch function of that name
(`torch_extern_kernels()`, recorded beside the artifact); any other name is looked up in the real namespace on
first use. A torch that loads differently fails inside the window; the caller then loads the ordinary way.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import types
from typing import Any, Iterable

import torch

_SELECT_ALGORITHM = "torch._inductor.select_algorithm"
# Who asks for the stand-ins' names while an artifact loads: torch's load, its cache, and the generated code (a
# module named under `compile_tasks`). Anything else asking (a real compiler module being imported, say) gets the
# real module, so no real module ever keeps a stand-in's answer.
_LOADERS = ("torch._inductor.standalone_compile", "torch._inductor.codecache", "torch._inductor.output_code",
            "torch._inductor.runtime.compile_tasks.")


# Inductor's compiler: what a warm start has no use for, and what the stand-ins keep it from importing (with the
# scheduler and lowering tables those modules import in turn)
COMPILER_MODULES = ("torch._inductor.compile_fx", "torch._inductor.select_algorithm", "torch._inductor.graph",
                    "torch._inductor.lowering", "torch._inductor.decomposition", "torch._inductor.debug",
                    "torch._inductor.scheduler", "torch._inductor.codegen.memory_planning")


def compiler_modules_imported() -> list[str]:
    """Which of Inductor's compiler modules this process has imported (a warm start: none)."""
    return [name for name in COMPILER_MODULES if name in sys.modules]


def torch_extern_kernels() -> list[str]:
    """The names under Inductor's `extern_kernels` that are the torch function of the same name (`mm`, `addmm`,
    ...), read in a process that imported `select_algorithm` (one that compiled); empty where none did."""
    module = sys.modules.get(_SELECT_ALGORITHM)
    if module is None or isinstance(module, _StandIn):
        return []
    kernels = getattr(module, "extern_kernels", None)
    return sorted(name for name, value in vars(kernels).items()
                  if not name.startswith("_") and getattr(torch, name, None) is value) if kernels is not None else []


def _real(name: str) -> types.ModuleType:
    """The real module `name`, imported now if a stand-in holds its place (every stand-in of that load leaves
    first: the real module's own imports must not meet one)."""
    module = sys.modules.get(name)
    if isinstance(module, _StandIn):
        module._vgc_window.retire()
        module = sys.modules.get(name)
    return module if module is not None else importlib.import_module(name)


class _Window:
    """One load's stand-ins: answered to the loading thread until the load ends or a real import is needed."""

    def __init__(self):
        self.owner = threading.get_ident()
        self.placed: dict[str, _StandIn] = {}

    def place(self, name: str, answers: dict[str, Any]) -> None:
        if name not in sys.modules:
            self.placed[name] = sys.modules[name] = _StandIn(name, answers, self)

    def retire(self) -> None:
        for name, stand_in in self.placed.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
        self.placed.clear()


class _StandIn(types.ModuleType):
    """A module's place in `sys.modules` during one thread's load: a few names for that thread, the real module
    for everything else."""

    def __init__(self, name: str, answers: dict[str, Any], window: _Window):
        super().__init__(name)
        self._vgc_answers = answers
        self._vgc_window = window

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr.startswith("_vgc_"):
            raise AttributeError(attr)
        window = self._vgc_window
        if attr in self._vgc_answers and threading.get_ident() == window.owner and window.placed and \
                sys._getframe(1).f_globals.get("__name__", "").startswith(_LOADERS):
            return self._vgc_answers[attr]
        return getattr(_real(self.__name__), attr)


class TorchKernels:
    """`extern_kernels` for generated code loaded in a stand-in's window: a recorded name is the torch function of
    that name; anything else is the real namespace's entry, looked up once."""

    def __init__(self, names: Iterable[str]):
        self._names = frozenset(n for n in names if isinstance(n, str) and n.isidentifier() and not n.startswith("_"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_names":
            raise AttributeError(name)
        value = getattr(torch, name, None) if name in self._names else None
        if value is None:
            value = getattr(_real(_SELECT_ALGORITHM).extern_kernels, name)
        setattr(self, name, value)
        return value


def select_decomp_table() -> Any:
    """What a loaded graph keeps as its decomposition table's getter (for a recompile): Inductor's own, imported
    when called."""
    return _real("torch._inductor.decomposition").select_decomp_table()


def _align(nbytes: Any) -> Any:
    return _real("torch._inductor.codegen.memory_planning")._align(nbytes)


class _NoOutputCodeHook:
    """`GraphLowering` as a cache hit reads it: no test hook on the output code (the real class has none set
    until a process imports it)."""
    save_output_code = None


class _DebugFlags(types.ModuleType):
    """`torch._inductor.debug` as a compiled graph's call reads it, until the real module is imported (which then
    takes this attribute's place on the package): its recording flag starts False and only its own functions set
    it. Any other name imports the real module."""

    RECORD_GRAPH_EXECUTION = False

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(_real("torch._inductor.debug"), attr)


@contextlib.contextmanager
def deferred_compiler(extern_kernel_names: Iterable[str] = ()):
    """Stand-ins for the compiler's modules that are not imported yet, for this thread, while it loads."""
    import torch._inductor
    import torch._inductor.async_compile   # noqa: F401  the runtime generated code uses; the package needs it set

    window = _Window()
    window.place("torch._inductor.compile_fx", {"_CompileFxKwargs": dict})
    window.place("torch._inductor.decomposition", {"select_decomp_table": select_decomp_table})
    window.place("torch._inductor.graph", {"GraphLowering": _NoOutputCodeHook})
    window.place(_SELECT_ALGORITHM, {"extern_kernels": TorchKernels(extern_kernel_names)})
    window.place("torch._inductor.codegen.memory_planning", {"_align": _align})
    if "torch._inductor.debug" not in sys.modules and "debug" not in vars(torch._inductor):
        torch._inductor.debug = _DebugFlags("torch._inductor.debug")
    try:
        yield
    finally:
        window.retire()
