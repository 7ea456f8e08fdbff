"""`vgc.counters`: a process-wide record of what the compiler did, read by tests, stats and checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
    cache_corrupt: int = 0          # artifacts that failed their content check and were rebuilt
    static_dispatches: int = 0      # piece calls served by a compile_sizes artifact
    dynamic_dispatches: int = 0     # piece calls served by the symbolic-size artifact
    cudagraph_captures: int = 0
    cudagraph_replays: int = 0
    eager_runs: int = 0             # calls that ran without a CUDA graph

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


counters = Counters()
