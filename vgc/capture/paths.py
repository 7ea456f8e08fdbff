"""Paths into a call's arguments (`kv[0]`, `meta.lens`), as vgc writes them and as Dynamo names them
(`L['kv'][0].size()[2]`), the tensors found along them, and the error a call that differs from its trace raises."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import torch


class InputMismatchError(TypeError):
    """A call's inputs differ from the traced ones in a way the compiled graph cannot serve."""


# A path into an argument: item steps (`[0]`, `['k']`) and attribute steps (`.field`, for dataclasses).
Step = tuple[str, Any]   # ("item", key) or ("attr", name)


def render_path(steps: tuple[Step, ...]) -> str:
    return "".join(f".{key}" if kind == "attr" else f"[{key!r}]" for kind, key in steps)


def follow(value: Any, steps: tuple[Step, ...]) -> Any:
    for kind, key in steps:
        value = getattr(value, key) if kind == "attr" else value[key]
    return value


def reader(places: list[tuple[str, tuple[Step, ...]]]) -> Callable[[dict], list]:
    """`arguments -> [the value at each (argument, path) of places]`, for a per-call read of many places (a FULL
    graph's KV caches): a run of places that are items 0..n-1 of one list or tuple argument is read as that
    argument whole, one lookup instead of n."""
    runs: list[tuple[str, int | None, tuple]] = []   # (argument, n for a whole sequence else None, path)
    for name, steps in places:
        last = runs[-1] if runs else None
        if steps == (("item", 0),):
            runs.append((name, 1, ()))
        elif last is not None and last[0] == name and last[1] is not None and steps == (("item", last[1]),):
            runs[-1] = (name, last[1] + 1, ())
        else:
            runs.append((name, None, steps))

    def read(arguments: dict) -> list:
        out = []
        for name, whole, steps in runs:
            value = arguments[name]
            if whole is None:
                out.append(follow(value, steps))
            elif type(value) in (list, tuple) and len(value) == whole:
                out.extend(value)
            else:   # another layout than at capture: read item by item, as any other place
                out.extend(value[i] for i in range(whole))
        return out
    return read


def children(value: Any) -> list[tuple[Step, Any]] | None:
    """The parts of a container vgc checks per call (list, tuple, dict, dataclass); None for anything else."""
    if isinstance(value, (list, tuple)):
        return [(("item", i), v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return [(("item", k), v) for k, v in value.items()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(("attr", f.name), getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def argument_tensors(value: Any, steps: tuple[Step, ...] = ()) -> list[tuple[tuple[Step, ...], torch.Tensor]]:
    """Every tensor in an argument with its path: the tensor itself (path ()), or one inside its containers."""
    if isinstance(value, torch.Tensor):
        return [(steps, value)]
    parts = children(value)
    return [found for step, child in parts for found in argument_tensors(child, steps + (step,))] if parts else []


def describe(value: Any) -> str:
    """A value for an error message: shape and dtype for a tensor, never its contents."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__}"


SizeLocation = tuple[str, tuple[Step, ...], int]   # (argument, path inside it, dim)


def size_name(location: SizeLocation) -> str:
    arg, steps, dim = location
    return f"{arg}{render_path(steps)}.size({dim})"


_SOURCE_ARGUMENT = re.compile(r"L\['(\w+)'\]")
_SOURCE_STEP = re.compile(r"\[(\d+)\]|\['([^'\\]*)'\]|\.(\w+)(?![\w(])")
_SOURCE_SIZE = re.compile(r"\.size\(\)\[(\d+)\]")


def parse_size_source(source: str) -> SizeLocation | None:
    """Where a size symbol is read, from Dynamo's source name ("L['kv'][0].size()[2]", "L['meta'].lens.size()[0]");
    None for a source that is not a dim of an argument's tensor (a buffer of the model, a tensor's value)."""
    match = _SOURCE_ARGUMENT.match(source)
    if match is None:
        return None
    arg, position, steps = match[1], match.end(), []
    while (step := _SOURCE_STEP.match(source, position)) is not None:
        index, key, attribute = step.groups()
        steps.append(("item", int(index)) if index is not None else ("item", key) if key is not None
                     else ("attr", attribute))
        position = step.end()
    size = _SOURCE_SIZE.fullmatch(source, position)
    return None if size is None else (arg, tuple(steps), int(size[1]))


def resolve_source(source: str, roots: dict[str, Any]) -> Any:
    """The object Dynamo's source name `L['<root>']...` names, read from `roots`; raises LookupError when the path
    does not exist (or is not a chain of items and attributes)."""
    match = _SOURCE_ARGUMENT.match(source)
    if match is None or match[1] not in roots:
        raise LookupError(f"{source}: not rooted at one of {sorted(roots)}")
    value, position = roots[match[1]], match.end()
    while position < len(source):
        step = _SOURCE_STEP.match(source, position)
        if step is None:
            raise LookupError(f"{source}: cannot follow {source[position:]!r}")
        index, key, attribute = step.groups()
        try:
            value = value[int(index)] if index is not None else value[key] if key is not None else \
                getattr(value, attribute)
        except (KeyError, IndexError, AttributeError, TypeError) as e:
            raise LookupError(f"{source}: {type(e).__name__} at {step[0]!r}") from e
        position = step.end()
    return value
