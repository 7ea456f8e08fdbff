"""The pass manager: vgc's graph passes and the user's, run by Inductor on every compiled piece.

Inductor calls `post_grad_custom_post_pass(graph)` once per compile, on the post-grad ATen graph (after
functionalisation and Inductor's own clean-ups, before lowering). `PassManager` sits in that slot and runs its
passes in order. Its `uuid()` joins every pass's identity (a built-in pass: the source of its module and its
options; a user's pass: its own `uuid()`), so Inductor's FX graph cache and vgc's piece keys both change when any
pass does. `VGC_DEBUG_DUMP_PATH` makes it write each piece's graph before and after every pass.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch.fx as fx

from vgc import _compat, envs
from vgc.passes import BUILTIN_PASSES, enabled

logger = logging.getLogger("vgc")


class GraphPassError(RuntimeError):
    """A graph pass raised while Inductor compiled a piece; the message names the pass."""


@dataclass(frozen=True)
class NamedPass:
    name: str
    run: Callable[[fx.Graph], Any]
    identity: str   # changes whenever what the pass does changes


def builtin_identity(fn: Callable, options: Any = None) -> str:
    """A built-in pass's identity: the source of the module that defines it, and its options."""
    module = inspect.getmodule(fn)
    source = inspect.getsource(module) if module is not None else inspect.getsource(fn)
    return hashlib.sha256(f"{source}\n{options!r}".encode()).hexdigest()


def user_identity(name: str, user_pass: Any) -> str:
    """A user's pass is identified by its own `uuid()` (torch's `CustomGraphPass` contract)."""
    uuid = getattr(user_pass, "uuid", None)
    if not callable(user_pass) or not callable(uuid):
        raise ValueError(f"inductor_passes[{name!r}] must be a torch CustomGraphPass or a callable with a uuid() "
                         f"method that changes when the pass does, got {type(user_pass).__name__}")
    return f"{name}:{uuid()}"


_dumps = itertools.count()


class PassManager(_compat.CustomGraphPass):
    """Runs `passes` in order on each graph Inductor hands it."""

    def __init__(self, passes: list[NamedPass]):
        self.passes = list(passes)

    def __call__(self, graph: fx.Graph) -> None:
        dump = envs.debug_dump_path()
        index = next(_dumps) if dump else 0
        for step, graph_pass in enumerate(self.passes):
            if dump:
                _write(dump, f"piece-{index:04d}-{step:02d}-before-{graph_pass.name}.py", graph)
            try:
                graph_pass.run(graph)
            except Exception as error:   # noqa: BLE001 - named here, whatever the pass raised
                raise GraphPassError(f"vgc: graph pass {graph_pass.name!r} failed on a piece: "
                                     f"{type(error).__name__}: {error}") from error
            if dump:
                _write(dump, f"piece-{index:04d}-{step:02d}-after-{graph_pass.name}.py", graph)

    def uuid(self) -> str:
        blob = "\n".join(f"{p.name}={p.identity}" for p in self.passes)
        return hashlib.sha256(blob.encode()).hexdigest()

    def __repr__(self) -> str:   # stable across processes: piece keys include the Inductor options' repr
        return f"PassManager({', '.join(p.name for p in self.passes)}; {self.uuid()[:16]})"


def pass_manager(pass_config: dict[str, bool], user_passes: dict[str, Any]) -> PassManager | None:
    """vgc's switched-on passes, then the user's, in one manager; None when there is no pass to run."""
    passes = [NamedPass(name, builtin.run, builtin_identity(builtin.run, builtin.options and builtin.options()))
              for name, builtin in BUILTIN_PASSES.items() if builtin.stage == "post_grad" and enabled(name, pass_config)]
    passes += [NamedPass(name, user_pass, user_identity(name, user_pass)) for name, user_pass in user_passes.items()]
    return PassManager(passes) if passes else None


def _write(directory: str, name: str, graph: fx.Graph) -> None:
    """Debug dumps never fail a compile."""
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name), "w") as f:
            f.write(str(graph))
    except OSError as error:
        logger.warning("could not write the graph dump %s in %s: %s", name, directory, error)
