"""Compile ranges for `vgc.compile`: one trace per interval of sizes that the model's size conditions carve out.

A trace holds on one side of every size condition the model or Inductor relied on (`if x.size(1) >= 8`, a sliding
window, `s <= 4096` in generated code); its input contract checks them on every call. `cover` finds the interval
of sizes around the traced one that the trace serves, by asking the contract at probed sizes, traces again just
past each end, and repeats until the sizes asked for are covered or the number of traces reaches `MAX_RANGES`.

Calls are routed by contract, not by size: each runs on the first range whose checks it passes. A probe that
misjudges an interval (a condition that is not a bound, such as divisibility) can leave sizes uncovered, which
then raise `InputMismatchError`, but can never send a call to a trace that cannot serve it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("vgc")

MAX_RANGES = 16   # traces per model; more means a condition that is not a bound (a divisibility test, say)


@dataclass
class CompileRange:
    low: int
    high: int
    trace_size: int
    model: Any   # the CompiledModel traced for it

    def report(self) -> dict[str, Any]:
        return {"sizes": [self.low, self.high], "trace_size": self.trace_size,
                "trace_source": self.model.trace_source}


def interval_around(accepts: Callable[[int], bool], start: int, low: int, high: int) -> tuple[int, int]:
    """The interval of sizes within [low, high] around `start` (which `accepts`) that `accepts`, assuming the
    accepted sizes near `start` are contiguous: galloping out from `start`, then bisecting each edge."""
    return _edge(accepts, start, low, -1), _edge(accepts, start, high, 1)


def _edge(accepts: Callable[[int], bool], start: int, limit: int, direction: int) -> int:
    good, step = start, 1
    while True:
        probe = start + direction * step
        if (probe - limit) * direction > 0:
            probe = limit
        if probe == good:
            return good
        if not accepts(probe):
            bad = probe
            break
        good, step = probe, step * 2
    while abs(bad - good) > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if accepts(middle) else (good, middle)
    return good


def cover(first: Any, trace_size: int, low: int, high: int, accepts: Callable[[Any, int], bool],
          trace_at: Callable[[int, int], Any | None]) -> tuple[list[CompileRange], list[tuple[int, int]]]:
    """Ranges covering [low, high], starting from `first`, a model traced at `trace_size`; `accepts(model, n)`
    says whether a model's contract takes the inputs of size n, `trace_at(n, index)` traces the range `index` at
    size n (None: the trace failed, warned). Returns the ranges by size and the intervals left uncovered."""
    lo, hi = interval_around(lambda n: accepts(first, n), trace_size, low, high)
    ranges, uncovered = [CompileRange(lo, hi, trace_size, first)], []
    todo = [(hi + 1, high, hi + 1), (low, lo - 1, lo - 1)]   # (first size, last size, where to trace it)
    while todo:
        a, b, at = todo.pop(0)
        if a > b:
            continue
        if len(ranges) >= MAX_RANGES:
            uncovered.append((a, b))
            continue
        model = trace_at(at, len(ranges))
        if model is None:
            uncovered.append((a, b))
            continue
        if not accepts(model, at):   # e.g. Inductor assumed more than the trace's size allows
            logger.warning("compile ranges: the trace at size %d does not serve that size itself; sizes %d-%d stay "
                           "uncovered", at, a, b)
            uncovered.append((a, b))
            continue
        lo, hi = interval_around(lambda n, m=model: accepts(m, n), at, a, b)
        ranges.append(CompileRange(lo, hi, at, model))
        todo += [(hi + 1, b, hi + 1), (a, lo - 1, lo - 1)]
    if uncovered and len(ranges) >= MAX_RANGES:
        logger.warning("compile ranges: %d traces did not cover sizes %s (a size condition that is not a bound, "
                       "such as divisibility?); calls of those sizes raise InputMismatchError", MAX_RANGES,
                       ", ".join(f"{a}-{b}" for a, b in uncovered))
    return sorted(ranges, key=lambda r: r.low), uncovered
