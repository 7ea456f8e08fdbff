"""A model and a call, written for another process to compile: every large tensor (weights, KV caches) as its
shape, strides, dtype and device only, made again there as zeros; small tensors (token ids, positions, lengths)
with their values, since a traced program runs its first call and the model may branch on them on the host.

What a compile needs of a model is its code, its module tree, its plain attributes and its tensors' metadata, not
the weights' values: vgc's pieces take the weights as inputs. So a background compile of a 1B-parameter model
writes about 20-40 kB instead of its 2.4 GB, and holds its own zeros on the device while it compiles.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

# Tensors up to this many elements travel with their values (the call's metadata); larger ones as zeros.
SMALL_TENSOR = 1 << 16
# A module's instance attribute naming its other instance attributes that belong to this process (a wrapper
# installed on it, an engine holding its caches): a copy leaves them out, and its class's methods serve there.
PROCESS_LOCAL = "_vgc_process_local"


class ModelCopyError(ValueError):
    """The model or its call cannot be written for another process (a class defined in `__main__`, a lambda, a
    tensor subclass, an object pickle cannot name)."""


def _zeros(shape, stride, dtype, device, requires_grad, parameter):
    tensor = torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()
    return torch.nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor


def _module(cls: type, state: dict):
    module = cls.__new__(cls)
    module.__setstate__(state)
    return module


def _valued(data: bytes, parameter: bool, requires_grad: bool):
    tensor = torch.load(io.BytesIO(data), weights_only=True)
    return torch.nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor


class _Writer(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, torch.nn.Module) and PROCESS_LOCAL in obj.__dict__:
            local = {PROCESS_LOCAL, *obj.__dict__[PROCESS_LOCAL]}
            return _module, (type(obj), {k: v for k, v in obj.__dict__.items() if k not in local})
        if not isinstance(obj, torch.Tensor):
            if isinstance(obj, type) and obj.__module__ == "__main__":
                raise ModelCopyError(f"class {obj.__qualname__} is defined in __main__, which another process "
                                     "cannot import: define it in a module")
            return NotImplemented
        parameter = type(obj) is torch.nn.Parameter
        if type(obj) is not torch.Tensor and not parameter:
            raise ModelCopyError(f"a {type(obj).__name__} (a tensor subclass) cannot be copied to another process")
        if obj.numel() <= SMALL_TENSOR and obj.layout == torch.strided and not obj.is_meta:
            buffer = io.BytesIO()
            torch.save(obj.detach().clone(), buffer)
            return _valued, (buffer.getvalue(), parameter, obj.requires_grad)
        return _zeros, (tuple(obj.shape), tuple(obj.stride()), obj.dtype, str(obj.device), obj.requires_grad,
                         parameter)


def dumps(value: Any) -> bytes:
    """`value` (a model, a call's arguments) as bytes for `loads` in another process; raises `ModelCopyError`."""
    buffer = io.BytesIO()
    try:
        _Writer(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise ModelCopyError(f"it cannot be written for another process ({type(e).__name__}: {e})") from e
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    """What `dumps` wrote, with its large tensors as zeros on their devices."""
    return pickle.loads(data)
