"""Start-up of a model whose ranks talk to each other: each rank's `vgc.compile` start checks in with the others.

Every rank traces its own model and compiles (or loads from its own `rank_<r>_<dp>/` directory) only what its
cache lacks; compiling runs no collective, so no rank waits on another's compiles while compiling. The wait comes
once, after a rank has built every piece and before its first run, which is the first collective: a rank whose
start failed says so instead of leaving the others blocked in that collective. Every rank then raises
`RankFailedError` naming the failed rank and its error; a rank that never checks in (killed, hung) is named once
`VGC_RANK_TIMEOUT_S` (default 1800) have passed.

The check-in goes through torch.distributed's key-value store (the one `init_process_group` made), not through a
collective, so a failed rank can post at any point of its start. Ranks must start their models in the same order,
as a tensor-parallel server does: the n-th start of each rank meets the n-th start of the others.
"""

from __future__ import annotations

import itertools
import logging
import os
import traceback
from datetime import timedelta

from vgc import _compat

logger = logging.getLogger("vgc")

_OK = "ok"
_starts = itertools.count()   # this process's `vgc.compile` starts while a multi-rank group exists


class RankFailedError(RuntimeError):
    """Another rank's start of the same model failed, or it never reported: this rank stops too, instead of
    waiting forever in the model's first collective."""


def rank_timeout_s() -> float:
    raw = os.environ.get("VGC_RANK_TIMEOUT_S", "1800")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"VGC_RANK_TIMEOUT_S={raw!r} must be a positive number of seconds")
    return value


def initialized() -> bool:
    """torch.distributed has a default process group in this process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the world size of the default group; (0, 1) without one."""
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if initialized() else (0, 1)


def world() -> tuple[int, int] | None:
    """(rank, world size) of this process when a process group of more than one rank exists, else None."""
    rank, size = rank_and_size()
    return (rank, size) if size > 1 else None


class StartCheckIn:
    """One start's check-in. `failed(error)` posts this rank's failure; `ready(collectives)` posts success and,
    when the model runs collectives, waits for every rank's report. Each posts at most once."""

    def __init__(self):
        found = world()
        self.store = _compat.default_store() if found is not None else None
        if found is not None and self.store is None:
            logger.debug("no torch.distributed store to check in with; ranks start without it")
        self.rank, self.size = found if found is not None else (0, 1)
        self.index = next(_starts) if self.store is not None else None
        self.posted = False

    def _key(self, rank: int) -> str:
        return f"vgc/start/{self.index}/rank/{rank}"

    def _post(self, value: str) -> None:
        self.posted = True
        self.store.set(self._key(self.rank), value)

    def failed(self, error: BaseException) -> None:
        if self.store is None or self.posted:
            return
        summary = "".join(traceback.format_exception_only(type(error), error)).strip()
        try:
            self._post(f"failed: {summary[-2000:]}")
        except Exception as e:   # the store itself is gone: the rank's own error is what matters
            logger.warning("could not tell the other ranks that this start failed (%s)", e)

    def ready(self, collectives: int) -> None:
        """Post success; if the model runs collectives, wait for every rank and raise if one failed."""
        if self.store is None or self.posted:
            return
        self._post(_OK)
        if not collectives:
            return
        timeout = rank_timeout_s()
        others = [r for r in range(self.size) if r != self.rank]
        try:
            self.store.wait([self._key(r) for r in others], timedelta(seconds=timeout))
        except Exception as e:   # torch raises its store's own timeout error
            missing = [r for r in others if not self.store.check([self._key(r)])]
            raise RankFailedError(
                f"vgc: rank(s) {missing} did not finish starting this model within {timeout:.0f} s "
                f"(VGC_RANK_TIMEOUT_S); rank {self.rank} stops instead of waiting in the model's first collective. "
                f"A rank that died or hangs is the cause: see its log ({type(e).__name__})") from None
        failures = {r: self.store.get(self._key(r)).decode() for r in others}
        failures = {r: v for r, v in failures.items() if v != _OK}
        if failures:
            first, message = next(iter(failures.items()))
            raise RankFailedError(f"vgc: rank {first} failed to start this model ({message.removeprefix('failed: ')})"
                                  f"; rank {self.rank} stops too" + (f" (failed ranks: {sorted(failures)})"
                                                                    if len(failures) > 1 else ""))
        logger.info("rank %d: all %d ranks started this model", self.rank, self.size)
