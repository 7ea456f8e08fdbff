"""What the compiler did, counted: `vgc.counters` for the whole process, one `Counters` record per model.

A compiled model owns a record whose parent is `vgc.counters`: what it adds goes to both, so two models in one
process (or thread) each report their own work while the process total stays complete. Per-call events
(dispatches, replays, un-graphed runs) are counted in the process total only: the hot path pays for one
increment, not two.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Iterator

_PER_CALL = {"per_call": True}


@dataclass
class Counters:
    dynamo_traces: int = 0          # backend invocations (one per Dynamo graph)
    pieces: int = 0                 # pieces after splitting, splitting pieces included
    splitting_pieces: int = 0       # pieces that run eagerly (attention)
    unique_pieces: int = 0          # distinct compiled piece graphs
    inductor_compiles: int = 0      # real Inductor invocations
    artifacts_loaded: int = 0       # artifacts read from the on-disk cache
    artifacts_saved: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_corrupt: int = 0          # artifacts (or saved traces) that failed their check and were rebuilt
    cudagraph_captures: int = 0
    traces_saved: int = 0           # Dynamo programs saved for warm starts (vgc.compile)
    traces_loaded: int = 0          # saved programs a start ran instead of tracing
    static_dispatches: int = field(default=0, metadata=_PER_CALL)    # piece calls served by a compile_sizes artifact
    dynamic_dispatches: int = field(default=0, metadata=_PER_CALL)   # piece calls served by the symbolic-size one
    cudagraph_replays: int = field(default=0, metadata=_PER_CALL)
    eager_runs: int = field(default=0, metadata=_PER_CALL)           # calls that ran without a CUDA graph
    encoder_replays: int = field(default=0, metadata=_PER_CALL)      # encoder budget graphs replayed
    encoder_eager_runs: int = field(default=0, metadata=_PER_CALL)   # encoder sub-batches run by the eager forward

    def __post_init__(self):
        self.parent: Counters | None = None

    @classmethod
    def child_of(cls, parent: "Counters") -> "Counters":
        """A per-model record: what is added to it is added to `parent` too."""
        record = cls()
        record.parent = parent
        return record

    def add(self, **amounts: int) -> None:
        for name, amount in amounts.items():
            setattr(self, name, getattr(self, name) + amount)
        if self.parent is not None:
            self.parent.add(**amounts)

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self, per_call: bool = True) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if per_call or not f.metadata.get("per_call")}

    @contextlib.contextmanager
    def delta(self) -> Iterator[dict[str, int]]:
        """`with counters.delta() as d: ...` — afterwards `d` holds the change of every counter in the block."""
        before = self.as_dict()
        changes: dict[str, int] = {}
        try:
            yield changes
        finally:
            changes.update({name: value - before[name] for name, value in self.as_dict().items()})

    @contextlib.contextmanager
    def expect(self, **changes: int) -> Iterator[dict[str, int]]:
        """`with counters.expect(inductor_compiles=0, dynamo_traces=0): ...` raises AssertionError when the block
        changed a named counter by any other amount (e.g. a request that compiled)."""
        unknown = sorted(set(changes) - set(self.as_dict()))
        if unknown:
            raise ValueError(f"unknown counter(s) {unknown}; counters are {sorted(self.as_dict())}")
        with self.delta() as d:
            yield d
        wrong = {name: (d[name], want) for name, want in changes.items() if d[name] != want}
        if wrong:
            raise AssertionError("vgc counters changed unexpectedly: " + ", ".join(
                f"{name} changed by {got}, expected {want}" for name, (got, want) in wrong.items()))


counters = Counters()
