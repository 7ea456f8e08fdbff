"""Backend registration, pytrees and multi-tensor copies, torch.distributed.

Part of `vgc._compat`: every private torch API vgc uses (see its docstring)."""

from __future__ import annotations

from typing import Any, Callable

import torch


# ---- Backend registration -----------------------------------------------------------------------------------------

def _entry_point_provides(name: str) -> bool:
    from importlib.metadata import entry_points

    try:
        return name in entry_points(group="torch_dynamo_backends").names
    except Exception:  # broken metadata must not break `import vgc`
        return False


def register_backend_by_name(name: str, backend: Callable) -> None:
    """Make `torch.compile(backend=name)` work when vgc is importable but not installed.

    Where vgc is installed, torch finds it through the `torch_dynamo_backends` entry point and registers it
    itself; registering here too would make torch's lookup fail with "duplicate name".
    """
    from torch._dynamo.backends import registry

    if name in registry._COMPILER_FNS or _entry_point_provides(name):
        return
    registry.register_backend(compiler_fn=backend, name=name)


# ---- pytrees and multi-tensor copies ------------------------------------------------------------------------------

def tree_leaves(tree) -> list:
    """The leaves of a nested structure of lists, tuples, dicts and registered classes, in torch's pytree order
    (torch 2.11-2.13 have no public pytree module)."""
    from torch.utils import _pytree

    return _pytree.tree_leaves(tree)


def tree_map(fn: Callable, tree):
    """`tree` with every leaf replaced by `fn(leaf)`, in the order of `tree_leaves`."""
    from torch.utils import _pytree

    return _pytree.tree_map(fn, tree)


def tree_flatten(tree) -> tuple[list, Any]:
    """(leaves, spec) of `tree`, for `tree_unflatten`: the same walk as `tree_leaves`."""
    from torch.utils import _pytree

    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves: list, spec):
    """The structure `spec` (from `tree_flatten`) rebuilt around `leaves`."""
    from torch.utils import _pytree

    return _pytree.tree_unflatten(leaves, spec)


def copy_many(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """`target.copy_(source)` for every pair, in one multi-tensor kernel per dtype on CUDA (the private
    `torch._foreach_copy_`). Torch takes that path only for lists of one dtype: given mixed ones (a decode step's
    int64 ids and int32 lengths) it copies tensor by tensor, one memcpy launch each, so the pairs go to it by
    dtype."""
    if not targets:
        return
    first = targets[0].dtype
    if all(t.dtype is first for t in targets):
        torch._foreach_copy_(targets, sources)
        return
    groups: dict[torch.dtype, tuple[list, list]] = {}
    for target, source in zip(targets, sources):
        into, of = groups.setdefault(target.dtype, ([], []))
        into.append(target)
        of.append(source)
    for into, of in groups.values():
        torch._foreach_copy_(into, of)


def reduced_fp32_matmuls(device_type: str) -> bool:
    """Whether fp32 matmuls on `device_type` may round their inputs first (TF32 on CUDA; TF32 or bf16 through
    oneDNN on the CPU), however it was set (`allow_tf32`, `set_float32_matmul_precision`, the `fp32_precision`
    settings). Read through `fp32_precision`, which every spelling sets: torch warns when the legacy getter reads a
    setting made through the new API."""
    backend = {"cuda": torch.backends.cuda.matmul, "cpu": getattr(torch.backends.mkldnn, "matmul", None)}.get(
        device_type)
    precision = getattr(backend, "fp32_precision", None)
    if precision is None:
        return device_type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)
    if precision == "none":   # unset for this backend: the generic setting decides
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return precision not in ("ieee", "none")


# ---- torch.distributed --------------------------------------------------------------------------------------------

def default_store():
    """The key-value store `torch.distributed.init_process_group` made, or None (no group, or a torch without
    the accessor: then ranks start without checking in)."""
    import torch.distributed as dist

    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    if getter is None or not dist.is_initialized():
        return None
    try:
        return getter()
    except (RuntimeError, ValueError):
        return None
