"""A split graph as data: its pieces, the artifacts each compiled piece needs and how to run them.

The backend plans one from Dynamo's graph (with fake inputs, so Inductor can compile it); a warm start rebuilds
the same plan from a saved trace, with no Dynamo and no fake tensors, and only loads artifacts. `SavedGraph` is
what a `vgc.compile` backend hands Dynamo: torch's AOT precompile saves it with the program and loads it back.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx

from vgc import _compat
from vgc.piecewise.inductor import SizeSource
from vgc.piecewise.split import Piece


class MissingArtifact(LookupError):
    """A saved trace names an artifact the cache no longer holds (or holds damaged): trace and compile instead."""


@dataclass
class PiecePlan:
    """One piece of the split graph. A compiled piece has one artifact for the symbolic size and one per size in
    `sizes`; `module` and `example_inputs` exist only in a traced plan (what Inductor compiles from)."""
    name: str
    splitting: bool
    key: str = ""
    sizes: tuple[int, ...] = ()
    size_source: SizeSource | None = None
    has_symbols: bool = True
    single: bool = False                       # the piece returns one value, not a tuple
    module_state: tuple[bool, ...] = ()        # which inputs are the model's weights or buffers
    mutated: frozenset[int] = frozenset()      # inputs the piece writes in place
    module: fx.GraphModule | None = field(default=None, repr=False)
    example_inputs: list | None = field(default=None, repr=False)

    def artifact_name(self, size: int | None) -> str:
        return f"piece-{self.key}-{'dynamic' if size is None else size}"


@dataclass
class GraphPlan:
    split_gm: fx.GraphModule
    pieces: list[Piece]              # every piece, dead ones included (for stats and computation_graph.py)
    plans: list[PiecePlan]           # the live pieces, in graph order
    device_type: str
    shape_guards: list
    input_check: Any = None          # request_checks.InputIdCheck or None
    compiler_guards: list | None = None   # known once compiled (traced) or from the saved trace
    example_inputs: list | None = field(default=None, repr=False)   # Dynamo's fake inputs (traced plans only)
    seconds: dict[str, float] = field(default_factory=dict)
    saved_split: bytes | None = field(default=None, repr=False)   # the split graph, pickled before any piece ran
    state_tensors: list = field(default_factory=list)   # capture.model_state.StateTensor: the model's weights as traced
    code_files: set[str] = field(default_factory=set)   # files whose code made an operation (traced plans only)
    structure: tuple = ()   # capture.model_state.model_structure of the traced model (set by its TraceSession)
    state_values: list = field(default_factory=list)   # capture.state_values.StateValue: its plain values as traced
    collectives: int = 0    # calls that talk to other ranks (vgc::all_reduce, functional collectives)

    @property
    def traced(self) -> bool:
        return self.example_inputs is not None

    def forget_trace(self) -> None:
        """Drop the fake inputs and compiled modules once built and saved: they hold Dynamo's shape environment."""
        self.example_inputs = None
        self.plans = [p if p.splitting else replace(p, module=None, example_inputs=None) for p in self.plans]

    def snapshot_split(self, keep_pieces: bool = False) -> None:
        """Pickle the split graph now, before its eager pieces are rewritten for speed: compiled pieces become
        empty stand-ins (their artifacts replace them; with `keep_pieces`, for pieces that run without Inductor,
        they stay) and eager pieces with one structural key (the attention of every layer) are stored, and
        rebuilt, once: they take their inputs by position."""
        root = torch.nn.Module()
        by_key: dict[str, fx.GraphModule] = {}
        for plan in self.plans:
            if plan.splitting or keep_pieces:
                module = plan.module
                if plan.key and not any(n.op == "get_attr" for n in module.graph.nodes):   # constants: unique
                    module = by_key.setdefault(plan.key, module)
                root.add_module(plan.name, module)
            else:
                root.add_module(plan.name, torch.nn.Module())
        for piece in self.pieces:   # dead pieces are never called, but the graph still names them
            if not hasattr(root, piece.name):
                root.add_module(piece.name, torch.nn.Module())
        self.saved_split = pickle.dumps(fx.GraphModule(root, self.split_gm.graph), protocol=pickle.HIGHEST_PROTOCOL)

    def saved_state(self) -> dict[str, Any]:
        """What a warm start needs to rebuild the compiled forward: no fake tensors, no compiled modules."""
        if self.saved_split is None or self.compiler_guards is None:
            raise RuntimeError("vgc: a graph plan is saved only after it was snapshotted and compiled")
        return {
            "version": 1,
            "split": self.saved_split,
            "pieces": [(p.name, p.index, p.is_splitting) for p in self.pieces],
            "plans": [replace(p, module=None, example_inputs=None) for p in self.plans],
            "device_type": self.device_type,
            "shape_guards": self.shape_guards,
            "compiler_guards": self.compiler_guards,
            "input_check": self.input_check,
            "state_tensors": self.state_tensors,
            "structure": self.structure,
            "state_values": self.state_values,
            "collectives": self.collectives,
        }

    @classmethod
    def from_saved(cls, state: dict[str, Any]) -> "GraphPlan":
        if state.get("version") != 1:
            raise ValueError(f"saved graph version {state.get('version')!r} is not 1")
        split_gm = pickle.load(io.BytesIO(state["split"]))
        # Rebuilding re-traces the graph, which calls a module stored under several names by its first name only.
        stored = {p.name: getattr(split_gm, p.name) for p in state["plans"]
                  if isinstance(getattr(split_gm, p.name, None), fx.GraphModule)}   # compiled pieces: stand-ins
        by_key = {p.key: stored[p.name] for p in state["plans"] if p.name in stored}
        plans = [replace(p, module=stored.get(p.name) or by_key.get(p.key))
                 if p.splitting or p.name in stored or p.key in by_key else p for p in state["plans"]]
        modules = {p.name: p.module for p in plans}
        pieces = [Piece(name, index, splitting, modules.get(name) or getattr(split_gm, name, None))
                  for name, index, splitting in state["pieces"]]
        return cls(split_gm, pieces, plans, state["device_type"], state["shape_guards"], state["input_check"],
                   state["compiler_guards"], state_tensors=state["state_tensors"], structure=state["structure"],
                   state_values=state.get("state_values", []),
                   collectives=state.get("collectives", 0))


class SavedGraph(_compat.SerializableCallable):
    """The backend's result for `vgc.compile`: a plan, built (compiled or loaded) after Dynamo's capture, once the
    traced source files, and so the cache entry, are known. Torch's AOT precompile pickles it with the program."""

    def __init__(self, plan: GraphPlan, context: Any = None):
        self.plan = plan
        self.context = context          # the TracingContext Inductor compiles the symbolic-size artifacts in
        self.forward: Callable | None = None

    def build(self, backend, store) -> None:
        with _compat.within_tracing_context(self.context):
            self.forward = backend.build(self.plan, store)
        self.context = None

    def __call__(self, *args):
        if self.forward is None:
            raise RuntimeError("vgc: this saved graph has not been built; vgc.compile builds it before the first call")
        return self.forward(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: "SavedGraph") -> bytes:
        return pickle.dumps(fn.plan.saved_state(), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "SavedGraph":
        # The shape guards' sympy expressions unpickle by calling their constructors, which would simplify them
        # again (and import sympy's tensor algebra on the way: 0.04-0.1 s of a warm start); they were saved
        # simplified, so they are rebuilt as they are.
        with sympy.evaluate(False):
            state = pickle.loads(data)
        return cls(GraphPlan.from_saved(state))
