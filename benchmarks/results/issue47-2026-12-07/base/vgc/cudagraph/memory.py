"""Graph memory: what each captured size adds to a graph pool, the peak while capturing, and a budget that
capture stops at.

Graphs that share one pool are captured largest first: the first keeps its working set, and the later ones
reuse those blocks and add about their outputs. A size's memory is the device memory reserved while its graphs
were captured (the pool's growth, as nothing else allocates then). Before a size is captured, its growth is
estimated erring high (`estimate`); a size whose estimate would pass the budget is skipped (its calls pad to a
larger size, or run without a graph), and so is a size whose capture runs out of memory.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Hashable

logger = logging.getLogger("vgc")


class GraphMemory:
    def __init__(self, budget_bytes: float | None = None):
        self.budget_bytes = budget_bytes
        self.per_size: dict[Hashable, int] = {}   # in capture order
        self.sizes: dict[Hashable, int] = {}      # each key's size in tokens (or whatever its graphs scale with)
        self.skipped: dict[Hashable, str] = {}
        self.peak_bytes = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.per_size.values())

    def admits(self, key: Hashable, size: int, first_estimate: Callable[[], int]) -> bool:
        """Whether `key`'s graphs fit in what the budget leaves; if not, it is recorded as skipped.
        `first_estimate()` estimates the first graph's memory (a run's peak at that size), when none is known."""
        if self.budget_bytes is None:
            return True
        estimate = self.estimate(size) if self.per_size else first_estimate()
        if self.total_bytes + estimate <= self.budget_bytes:
            return True
        self.skipped[key] = (f"its graphs would need ~{estimate / 2 ** 20:.1f} MiB, past the budget of "
                             f"{self.budget_bytes / 2 ** 20:.1f} MiB")
        return False

    def estimate(self, size: int) -> int:
        """While the first graph is the only one: its growth scaled to `size` (it holds the working set the later
        ones reuse, so this errs high). Then: the most any later graph added, scaled up (not down) to `size`:
        the pool reserves whole segments, so a size's growth comes in lumps (often 0, then a whole segment), not
        in proportion to its outputs."""
        (first_key, first), *rest = self.per_size.items()
        if not rest:
            return math.ceil(first * min(1.0, size / self.sizes[first_key]))
        return math.ceil(max(grown * max(1.0, size / self.sizes[key]) for key, grown in rest))

    def captured(self, key: Hashable, size: int, grown: int) -> None:
        self.per_size[key] = max(0, grown)
        self.sizes[key] = size
        if self.budget_bytes is not None and self.total_bytes > self.budget_bytes:
            logger.warning("CUDA graphs of %s took %.1f MiB, more than estimated: graph memory is %.1f MiB, past "
                           "the budget of %.1f MiB; no more sizes are captured", key, self.per_size[key] / 2 ** 20,
                           self.total_bytes / 2 ** 20, self.budget_bytes / 2 ** 20)

    def out_of_memory(self, key: Hashable, reason: str) -> None:
        self.skipped[key] = f"out of memory while capturing ({reason})"
        logger.warning("CUDA graphs of %s: out of memory while capturing (%s); its calls pad to a larger size or "
                       "run without a graph", key, reason)

    def report(self) -> dict:
        return {"total_bytes": self.total_bytes, "peak_bytes": self.peak_bytes,
                "per_size_bytes": dict(self.per_size), "budget_bytes": self.budget_bytes,
                "skipped_sizes": dict(self.skipped)}

    def summary(self) -> str:
        skipped = f"; {len(self.skipped)} skipped: {sorted(self.skipped, key=str)}" if self.skipped else ""
        return (f"{self.total_bytes / 2 ** 20:.1f} MiB of graph memory (peak {self.peak_bytes / 2 ** 20:.1f} MiB "
                f"reserved while capturing){skipped}")
