"""Inductor: standalone compile, artifacts, configuration, custom passes, its in-memory caches, the hash of torch's
sources.

Part of `vgc._compat`: every private torch API vgc uses (see its docstring)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
from typing import Any, Callable, Iterable

import torch.fx as fx

from vgc._compat.inductor_load import deferred_compiler

logger = logging.getLogger("vgc")


# ---- Inductor: standalone compile, artifacts, configuration, custom passes, its in-memory caches ------------------

def standalone_compile(gm: fx.GraphModule, example_inputs: list, *, dynamic_shapes: str,
                       config_patches: dict[str, Any]):
    """One Inductor compile of `gm`, as a saveable CompiledArtifact; `torch._inductor` is private."""
    from torch._inductor import standalone_compile as _standalone_compile

    kwargs: dict[str, Any] = {"dynamic_shapes": dynamic_shapes, "options": {"config_patches": dict(config_patches)}}
    return _standalone_compile(gm, example_inputs, **kwargs)


def load_artifact(path: str, fmt: str, extern_kernels: Iterable[str] | None = None):
    """A CompiledArtifact saved by `standalone_compile`'s result, loaded (private `torch._inductor`).

    With `extern_kernels` (what `torch_extern_kernels()` answered where it was saved), it loads with Inductor's
    compiler modules deferred (`inductor_load`), and the ordinary way where that fails: the second load reports
    what is wrong with the file, if anything is."""
    from torch._inductor import CompiledArtifact

    if extern_kernels is not None:
        try:
            with deferred_compiler(extern_kernels):
                return CompiledArtifact.load(path=path, format=fmt)
        except Exception as e:  # noqa: BLE001  the ordinary load below decides
            logger.debug("artifact %s: a load without Inductor's compiler failed (%s: %s); loading it with it",
                         path, type(e).__name__, e)
    return CompiledArtifact.load(path=path, format=fmt)


@contextlib.contextmanager
def precompile_header_wrapped(wrap: Callable[[Callable[..., str], str], Callable[..., str]]):
    """While the block runs, Inductor's precompile of the header of its C++ kernels (private
    `codecache._precompile_header(header, hashable_cmd_line, **compile_command) -> the header's path`, made in
    `codecache._HEADER_DIR`) is `wrap(precompile, header_dir)`; where torch has no such function, it is left as
    it is."""
    try:
        from torch._inductor import codecache

        precompile, header_dir = codecache._precompile_header, codecache._HEADER_DIR
    except (ImportError, AttributeError):
        yield
        return
    codecache._precompile_header = wrap(precompile, header_dir)
    try:
        yield
    finally:
        codecache._precompile_header = precompile


def save_artifact(artifact, path: str, fmt: str) -> None:
    """Save what `standalone_compile` returned (a private `torch._inductor` CompiledArtifact)."""
    artifact.save(path=path, format=fmt)


@functools.cache
def inductor_option_names() -> frozenset[str]:
    """Every Inductor config option's name, for validating user options. `torch._inductor.config` is private; its
    names are fixed once torch is imported, so they are read once."""
    import torch._inductor.config as inductor_config

    return frozenset(inductor_config.get_config_copy())


def inductor_config_portable() -> dict[str, Any]:
    """Inductor's current config, without process-specific entries, for cache keys (private config module).

    Torch 2.15 runs a serializer over it that imports `torch._inductor.choices` (and with it the scheduler, the
    lowering tables and `select_algorithm`: 0.8 s) to turn `inductor_choices_class` into a key. While that module
    is not imported, no choices can be registered, and an unset class keys as None, its value already: the
    serializer is skipped then, so a warm start's cache key does not import the compiler."""
    import torch._inductor.config as inductor_config

    namespace = vars(inductor_config)   # a config module refuses to set names that are not its options
    serializer = namespace.get("_cache_config_serializer")
    if serializer is None or "torch._inductor.choices" in sys.modules or \
            getattr(inductor_config, "inductor_choices_class", None) is not None:
        return inductor_config.save_config_portable()
    namespace["_cache_config_serializer"] = None
    try:
        return inductor_config.save_config_portable()
    finally:
        namespace["_cache_config_serializer"] = serializer


def clear_inductor_memory_caches() -> None:
    """Drop Inductor's in-memory caches of loaded modules and kernel paths, after files under its cache directory
    were removed or the directory moved (private `torch._inductor.utils`)."""
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:
        return
    clear_caches()


def inductor_code_name(source: str) -> str | None:
    """The name Inductor gives the file of a generated module (`PyCodeCache.write`: a hash of the stripped source,
    no extra key), or None where this torch has no such function (`torch._inductor.codecache.code_hash`)."""
    try:
        from torch._inductor.codecache import code_hash
    except ImportError:
        return None
    return code_hash(source.strip())


_CUSTOM_PASS_OPTIONS = ("pre_grad_custom_pass", "joint_custom_pre_pass", "joint_custom_post_pass",
                        "post_grad_custom_pre_pass", "post_grad_custom_post_pass", "_pre_fusion_custom_pass",
                        "_post_fusion_custom_pass")


def inductor_custom_passes() -> dict[str, Any]:
    """The user passes set in Inductor's global config (left out of `save_config_portable`, but they change the
    generated code): option name -> the pass object, for those set (private config module)."""
    import torch._inductor.config as inductor_config

    found = {}
    for name in _CUSTOM_PASS_OPTIONS:
        value = getattr(inductor_config, name, None)
        if value is not None and value != []:
            found[name] = value
    return found


def _custom_graph_pass_base() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass as base  # private module

    return base


# The base class of Inductor's custom graph passes: a pass in `post_grad_custom_post_pass` must be one (with a
# `uuid()`) for Inductor to cache what it compiles.
CustomGraphPass = _custom_graph_pass_base()


def functorch_config_portable() -> dict[str, Any]:
    """AOTAutograd's current config, without process-specific entries, for cache keys (private config module)."""
    import torch._functorch.config as functorch_config

    return functorch_config.save_config_portable()


def torch_build_key() -> str:
    """A hash of the installed torch build, as Inductor's own cache keys it (private `codecache`)."""
    return torch_source_key().hex()[:32]


def torch_source_key(known: bytes | None = None) -> bytes:
    """Inductor's hash of torch's source files (private `codecache.torch_key`: it reads every torch module, 0.1-0.7
    s). `known`, the value an earlier process computed for these same files, is handed to Inductor instead, where
    torch allows it and has not computed its own yet (its cache has a `set`)."""
    from torch._inductor.codecache import torch_key

    if known is not None:
        try:
            torch_key.set(known)
        except (AttributeError, AssertionError, RuntimeError):   # no setter, or already known in this process
            pass
    return torch_key()


def triton_source_key(known: str | None = None) -> str | None:
    """Triton's hash of its compiler's sources and its library (`triton.runtime.cache.triton_key`, cached per
    process; Triton's and torch's private modules import it by name); None without Triton. `known`, the value an
    earlier process computed for these same files, answers instead, in every module that holds the function,
    unless this process has computed its own already."""
    try:
        import triton.runtime.cache as triton_cache
    except ImportError:
        return None
    current = triton_cache.triton_key
    computed = getattr(current, "cache_info", None)
    if known is None or computed is None or computed().currsize:   # nothing known, an unknown Triton, or too late
        return current()

    def triton_key() -> str:
        return known
    triton_key.cache_info = computed   # Triton's own cache stays empty: nothing was read
    triton_key.cache_clear = current.cache_clear
    for name, module in list(sys.modules.items()):
        if name.startswith(("triton", "torch")) and getattr(module, "triton_key", None) is current:
            module.triton_key = triton_key
    return known


def start_triton_driver() -> bool:
    """Start Triton's driver for this machine's GPU (private `triton.runtime.driver`), as its first kernel compile
    or load in a process would: with Triton's cache empty, that builds its C utilities with the host compiler
    (0.4 s on an H100 host). False without Triton or a GPU driver it can use."""
    try:
        from triton.runtime.driver import driver
    except ImportError:
        return False
    try:
        driver.active
    except RuntimeError:   # no active backend (no GPU), or more than one
        return False
    return True


def cpu_vec_isa() -> str:
    """The CPU vector ISA Inductor generates C++ for on this machine, e.g. "avx512" (private `cpu_vec_isa`).

    Inductor finds it by building and loading test libraries in its cache directory, under a file lock there; a
    root that is read-only or full fails that. The answer does not depend on where they are built, so the check
    then runs in a private temporary directory."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    try:
        return str(pick_vec_isa())
    except OSError as error:
        import logging

        logging.getLogger("vgc").warning(
            "Inductor's CPU check cannot write under %s (%s); it runs in a temporary directory instead",
            os.environ.get("TORCHINDUCTOR_CACHE_DIR", "Inductor's cache directory"), error.strerror or error)
        with tempfile.TemporaryDirectory(prefix="vgc-cpu-isa-") as private:
            saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = private
            try:
                return str(pick_vec_isa())
            finally:
                if saved is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def wrap_cpu_isa_probe(wrap: Callable[[Callable], Callable]) -> bool:
    """Replace Inductor's CPU vector-ISA load probe (`VecISA._probe_load(self, output_path) -> bool`: a
    subprocess that `dlopen`s a test library, torch >= 2.13) by `wrap(probe)`; False where torch has no such
    probe (before 2.13: `wrap_cpu_isa_check`) and nothing was replaced."""
    from torch._inductor.cpu_vec_isa import VecISA

    probe = getattr(VecISA, "_probe_load", None)
    if probe is None:
        return False
    VecISA._probe_load = wrap(probe)
    return True


def wrap_cpu_isa_check(wrap: Callable[[Callable], Callable]) -> bool:
    """Replace Inductor's whole CPU vector-ISA check (`VecISA.check_build(self, code) -> bool`, torch < 2.13: it
    builds a test library if needed, then loads it in a child Python that imports torch, about 3 s per ISA on a
    2-core machine) by `wrap(check)`; False where torch has the separate load probe (`wrap_cpu_isa_probe`)."""
    from torch._inductor.cpu_vec_isa import VecISA

    check = getattr(VecISA, "check_build", None)
    if check is None or hasattr(VecISA, "_probe_load"):
        return False
    VecISA.check_build = wrap(check)
    return True


def inductor_cpp_compiler() -> str:
    """Inductor's configured C++ compiler (`config.cpp.cxx`, private config module) and the binary its first
    name resolves to (path, size, modification time), for records of what it built: a compiler upgraded or
    replaced under the same name is another compiler."""
    import shutil

    import torch._inductor.config as inductor_config

    configured = inductor_config.cpp.cxx
    names = [name for name in (configured if isinstance(configured, (list, tuple)) else (configured,)) if name]
    binary = next(filter(None, map(shutil.which, names)), None)
    if binary is None:
        return repr((configured, None))
    binary = os.path.realpath(binary)
    try:
        status = os.stat(binary)
    except OSError:
        return repr((configured, binary))
    return repr((configured, binary, status.st_size, status.st_mtime_ns))


def inductor_cache_dir() -> str:
    """The directory Inductor keeps its compiled kernels in now (private `cache_dir_utils`)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()
