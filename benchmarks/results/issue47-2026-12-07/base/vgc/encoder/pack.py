"""Token budgets and greedy packing of encoder items into them: pure functions, no GPU, no model.

A budget is a token count one CUDA graph was captured at. At run time a batch of items (images, videos) is
cut into sub-batches, each replaying the smallest budget that holds it; the padding up to that budget is work
the GPU does for nothing, so both the budget levels and the packing aim to keep it small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from vgc.encoder.protocol import DEFAULT_PATH, EncoderItemSpec, GLOBAL_PATH, LOCAL_PATH

# Auto budgets grow by at most this factor per level: a sub-batch just over a level pads at most ~20%. The
# seed's powers of two (growth 2) pad up to ~50% and measurably cost mean latency on compute-bound batches
# (docs/benchmarks-log.md); finer levels cost more graphs, which share one memory pool.
DEFAULT_GROWTH = 1.25


def budget_levels(smallest: int, largest: int, *, unit: int | None = None, growth: float = DEFAULT_GROWTH
                  ) -> list[int]:
    """Budgets from `smallest` to `largest` (always included), each a multiple of `unit` (default `smallest`)
    and at most `growth` times the one before (but at least one `unit` more)."""
    if smallest < 1 or largest < smallest:
        raise ValueError(f"budget range must satisfy 1 <= smallest <= largest, got ({smallest}, {largest})")
    if growth <= 1:
        raise ValueError(f"budget growth must be > 1, got {growth}")
    unit = unit or smallest
    levels = [smallest]
    while True:
        step = max(unit, math.floor(levels[-1] * (growth - 1) / unit) * unit)
        following = levels[-1] + step
        if following >= largest:
            break
        levels.append(following)
    if levels[-1] != largest:
        levels.append(largest)
    return levels


@dataclass(frozen=True)
class PathBudgets:
    """The budgets of one encoder path and what a sub-batch on it may hold.

    `unit` (> 0) is the tokens per attention sequence (image, video frame) a budget is sized for: a budget of
    `b` tokens holds at most `b // unit` sequences, so its graph is captured with only that many sequence slots
    (each empty slot still costs attention work); a sub-batch of more, smaller sequences takes a larger budget.
    The largest budget holds `max_items` items and `max_frames` sequences whatever `unit` says, so every
    sub-batch the packer forms fits somewhere.
    """

    budgets: tuple[int, ...]
    max_items: int
    max_frames: int
    unit: int = 0

    def __post_init__(self):
        if not self.budgets or list(self.budgets) != sorted(set(self.budgets)) or self.budgets[0] < 0:
            raise ValueError(f"budgets must be distinct non-negative ints in increasing order, got {self.budgets}")
        if self.max_items < 1 or self.max_frames < 1:
            raise ValueError(f"max_items and max_frames must be >= 1, got {self.max_items}, {self.max_frames}")

    @property
    def largest(self) -> int:
        return self.budgets[-1]

    def capacity(self, budget: int) -> tuple[int, int]:
        """(items, sequences) a sub-batch replaying `budget` may hold."""
        if budget == self.largest or self.unit <= 0:
            return self.max_items, self.max_frames
        fit = max(1, budget // self.unit)
        return min(self.max_items, fit), min(self.max_frames, fit)

    def smallest_fit(self, items: int, tokens: int, frames: int) -> int | None:
        """The smallest positive budget holding this sub-batch; None when none does (run it eagerly)."""
        for budget in self.budgets:
            if budget >= max(tokens, 1):
                max_items, max_frames = self.capacity(budget)
                if items <= max_items and frames <= max_frames:
                    return budget
        return None


@dataclass(frozen=True)
class SubBatch:
    """Items packed together: `indices` into the specs, and per path the budget to replay (None: run that path
    eagerly; 0: the path has no tokens, nothing runs) and the tokens it really holds."""

    indices: tuple[int, ...]
    budgets: Mapping[str, int | None]
    tokens: Mapping[str, int]

    @property
    def budget(self) -> int | None:
        """The budget of the default path (the global one for dual-path encoders)."""
        return self.budgets.get(DEFAULT_PATH, self.budgets.get(GLOBAL_PATH))

    @property
    def local_budget(self) -> int | None:
        return self.budgets.get(LOCAL_PATH)


Budgets = Sequence[int] | PathBudgets | Mapping[str, Sequence[int] | PathBudgets]


def pack(specs: Sequence[EncoderItemSpec], budgets: Budgets, max_items: int, *, max_frames: int | None = None
         ) -> list[SubBatch]:
    """Cut `specs` into sub-batches: items sorted by output tokens (smallest first, ties by position) are added
    to the current sub-batch while it stays within every path's largest budget, `max_items` items and
    `max_frames` sequences; each sub-batch then takes, per path, the smallest budget that holds it. An item over
    some path's largest budget runs alone, eagerly on that path (and by graph on a path it fits); an item with an
    `eager_reason` runs alone, eagerly on every path.

    `budgets` is a list (single path), a `PathBudgets`, or a mapping `{"global": [...], "local": [...]}`
    for dual-path encoders (a local budget of 0 serves sub-batches without local patches).
    """
    paths = _as_paths(budgets, max_items, max_frames)
    order = sorted(range(len(specs)), key=lambda i: (specs[i].output_tokens, i))
    fits = {i: specs[i].eager_reason is None and all(specs[i].path_tokens(p) <= b.largest and
                                                     specs[i].frames <= b.max_frames for p, b in paths.items())
            for i in order}
    result: list[SubBatch] = []
    current: list[int] = []
    for i in (i for i in order if fits[i]):
        if current and not _can_add(current, i, specs, paths, max_items):
            result.append(_finish(current, specs, paths))
            current = []
        current.append(i)
    if current:
        result.append(_finish(current, specs, paths))
    result.extend(_finish([i], specs, paths, eager=specs[i].eager_reason is not None) for i in order if not fits[i])
    return result


def _as_paths(budgets: Budgets, max_items: int, max_frames: int | None) -> dict[str, PathBudgets]:
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise ValueError(f"max_items must be an int >= 1, got {max_items!r}")
    frames = max_frames if max_frames is not None else max_items
    mapping = budgets if isinstance(budgets, Mapping) else {DEFAULT_PATH: budgets}
    paths = {}
    for path, levels in mapping.items():
        if not isinstance(levels, PathBudgets):
            levels = PathBudgets(tuple(sorted(set(int(b) for b in levels))), max_items, frames)
        paths[path] = levels
    return paths


def _totals(indices: list[int], specs, path: str) -> tuple[int, int]:
    return sum(specs[i].path_tokens(path) for i in indices), sum(specs[i].frames for i in indices)


def _can_add(current: list[int], item: int, specs, paths: dict[str, PathBudgets], max_items: int) -> bool:
    if len(current) + 1 > max_items:
        return False
    for path, levels in paths.items():
        tokens, frames = _totals(current + [item], specs, path)
        if tokens > levels.largest or frames > levels.max_frames:
            return False
    return True


def _finish(indices: list[int], specs, paths: dict[str, PathBudgets], eager: bool = False) -> SubBatch:
    budgets, tokens = {}, {}
    for path, levels in paths.items():
        tokens[path], frames = _totals(indices, specs, path)
        budgets[path] = 0 if tokens[path] == 0 else None if eager else \
            levels.smallest_fit(len(indices), tokens[path], frames)
    return SubBatch(tuple(indices), budgets, tokens)
