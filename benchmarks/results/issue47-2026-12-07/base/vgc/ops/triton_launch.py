"""Low-overhead launches of vgc's own Triton kernels.

`kernel[grid](...)` re-derives the kernel's specialisation from every argument on every call, in Python. With
PIECEWISE graphs attention runs eagerly between the graphs, once per layer per step, and on the H200 machine
that per-launch work made a small model's decode step host-bound. `FastLauncher` keeps the compiled binary
under a key that is at least as fine as Triton's own, and launches it directly.

This uses Triton's `CompiledKernel.run` launcher as Triton 3.4 to 3.6 define it. Anything else (the CPU
interpreter, a Triton outside 3.4–3.x, a launch hook set by a profiler) takes the ordinary path.
"""

from __future__ import annotations

import torch

try:
    import triton
    from triton.runtime import driver
except ImportError:  # CPU-only installs
    triton = None
try:
    from triton import knobs
except ImportError:  # no Triton, or one older than 3.4
    knobs = None


def _triton_version() -> tuple[int, int]:
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


# `triton.knobs` and this `CompiledKernel.run` calling convention are those of Triton 3.4 to 3.6 (3.6 tested).
_LAUNCHER_KNOWN = knobs is not None and (3, 4) <= _triton_version() < (4, 0)


# Exact scalar values in the key (a batch size among them) make one entry per distinct batch size: bounded.
_MAX_KEYS = 4096


def _hook_set(hook) -> bool:
    # Triton 3.6 keeps a HookChain, empty unless a profiler adds to it; earlier 3.x keep None or a function.
    return hook is not None and getattr(hook, "calls", True) != []


class FastLauncher:
    """`FastLauncher(kernel)(grid, tensors, scalars, **constexprs)` launches `kernel` like
    `kernel[grid](*tensors, *scalars, **constexprs)`: the kernel's signature lists its tensor arguments first,
    then its scalar ones, then its constexprs.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.binaries: dict[tuple, object] = {}
        # Under TRITON_INTERPRET=1 kernels are interpreter functions, not JITFunctions: nothing to cache.
        self.fast = _LAUNCHER_KNOWN and isinstance(kernel, triton.runtime.jit.JITFunction)
        self.arg_names = list(getattr(kernel, "arg_names", []))

    def __call__(self, grid: tuple[int, ...], tensors: tuple, scalars: tuple, **constexprs):
        hooks = knobs.runtime if self.fast else None
        if hooks is None or _hook_set(hooks.launch_enter_hook) or _hook_set(hooks.launch_exit_hook):
            self.kernel[grid](*tensors, *scalars, **constexprs)
            return
        # The key holds every scalar's type and exact value and every tensor's dtype, which is finer than
        # Triton's own specialisation (ints by ==1 and %16, pointers by 16-byte alignment) provided every
        # pointer is aligned; a call with a misaligned tensor takes the ordinary path. It is built per launch,
        # so from whole tuples rather than argument by argument.
        aligned = not any(t.data_ptr() & 15 for t in tensors)
        key = (torch.cuda.current_device(), tuple([t.dtype for t in tensors]), tuple(map(type, scalars)),
               scalars, tuple(constexprs.values()))
        binary = self.binaries.get(key) if aligned else None
        if binary is None:
            binary = self.kernel[grid](*tensors, *scalars, **constexprs)   # compiles (or finds) and launches
            if aligned and len(self.binaries) < _MAX_KEYS and hasattr(binary, "packed_metadata"):
                self.binaries[key] = binary
            return
        grid = (*grid, 1, 1)
        first_constexpr = len(tensors) + len(scalars)
        ordered = [constexprs[name] for name in self.arg_names[first_constexpr:]]   # signature order
        binary.run(grid[0], grid[1], grid[2], driver.active.get_current_stream(key[0]), binary.function,
                   binary.packed_metadata, None, None, None, *tensors, *scalars, *ordered)
