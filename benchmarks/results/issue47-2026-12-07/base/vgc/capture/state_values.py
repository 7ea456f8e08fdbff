"""The plain values of a model's own state that a saved trace baked in (`self.head_dim == 16`, `self.eps == 1e-5`, a
module's hooks empty), recorded when the trace is captured and checked by vgc when
a later process loads it, in place of the Dynamo guards that would check them.

Dynamo rebuilds a saved program's guards when it loads one: about a thousand for a 16-layer decoder (one per
attribute read, per layer), which cost a warm start 0.3-0.7 s on an H100 host, most of it in building objects that
vgc evaluates once and then switches off. A value guard is taken over only when vgc can read the guarded value
itself, at capture, and gets the value Dynamo recorded; any other guard (global torch state, a global of the
model's module, a path vgc cannot follow, the keys of a dict whose order the trace relied on) stays Dynamo's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vgc.capture.paths import describe, resolve_source

_CONSTANTS = (bool, int, float, str, bytes, type(None))
_VALUE_GUARDS = {"CONSTANT_MATCH", "EQUALS_MATCH"}


@dataclass(frozen=True)
class StateValue:
    """A value of the model's state as the trace read it: at `source` (Dynamo's name, e.g.
    "L['self']._modules['norm'].eps"), `expected` under `kind`: "equals" (same type and value) or "empty" (an
    empty hooks dict)."""
    source: str
    kind: str
    expected: Any

    def mismatch(self, roots: dict[str, Any]) -> str | None:
        try:
            value = resolve_source(self.source, roots)
        except LookupError as e:
            return f"the model has no value at {e}"
        if _meets(self.kind, self.expected, value):
            return None
        if self.kind == "empty":
            return f"{self.source} holds {len(value) if hasattr(value, '__len__') else describe(value)} entries; the " \
                   "trace had none"
        return f"{self.source} is {_shown(value)}; the trace had {self.expected!r}"


def _plain(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isnan(value)   # NaN equals nothing: Dynamo's own guard keeps it
    if type(value) in _CONSTANTS:
        return True
    return type(value) in (tuple, list, frozenset) and all(_plain(v) for v in value)


def _same(expected: Any, value: Any) -> bool:
    """Equal with the same types throughout: 1, 1.0 and True are three values to a trace."""
    if type(expected) is not type(value):
        return False
    if type(expected) in (tuple, list):
        return len(expected) == len(value) and all(_same(a, b) for a, b in zip(expected, value))
    return expected == value


def _meets(kind: str, expected: Any, value: Any) -> bool:
    if kind == "equals":
        return _same(expected, value)
    return isinstance(value, dict) and not value


def _shown(value: Any) -> str:
    return repr(value) if _plain(value) else describe(value)


class StateValueRecorder:
    """A guard filter's helper at capture: `take_over(entry)` is True when vgc records the entry's check itself
    (Dynamo then leaves it out of the saved program). `model` is the traced forward's `self`."""

    root = "self"

    def __init__(self, model: Any):
        self.roots = {self.root: model}
        self.values: list[StateValue] = []
        self._seen: set[tuple[str, str]] = set()

    def take_over(self, entry) -> bool:
        name = entry.name
        if getattr(entry, "is_global", False) or not getattr(entry, "has_value", False) or \
                not (name == self.root or name.startswith((self.root + ".", self.root + "["))):
            return False
        kind = _kind(entry.guard_type, entry.value)
        if kind is None:
            return False
        source = f"L[{self.root!r}]" + name[len(self.root):]
        expected = None if kind == "empty" else entry.value
        try:   # only what vgc reads back as Dynamo saw it: a path it cannot follow stays Dynamo's guard
            if not _meets(kind, expected, resolve_source(source, self.roots)):
                return False
        except LookupError:
            return False
        if (source, kind) not in self._seen:
            self._seen.add((source, kind))
            self.values.append(StateValue(source, kind, expected))
        return True


def _kind(guard_type: str, value: Any) -> str | None:
    if guard_type in _VALUE_GUARDS and _plain(value):
        return "equals"
    if guard_type == "EMPTY_NN_MODULE_HOOKS_DICT" and isinstance(value, dict) and not value:
        return "empty"
    # DICT_KEYS_MATCH stays Dynamo's: a saved program re-reads the dicts whose key order it relied on at every load,
    # whatever guards it kept, and fails to load when no kept guard reads the model
    return None


def values_mismatch(values: list[StateValue], roots: dict[str, Any]) -> str | None:
    """The first recorded value the model no longer has, or None."""
    for value in values:
        problem = value.mismatch(roots)
        if problem is not None:
            return problem
    return None
