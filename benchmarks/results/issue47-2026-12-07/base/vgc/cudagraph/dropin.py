"""FULL CUDA graphs for drop-in `torch.compile(model, backend="vgc")`: the whole compiled forward, attention included,
captured per call signature as Dynamo hands them in.

`vgc.compile` owns its inputs (it pads them into its own buffers); a drop-in backend only sees what Dynamo passes.
So each Dynamo graph gets a `DropInGraphs` that keys calls by their sizes and, the second time it meets a key,
captures the forward with:
- the model's weights and buffers, and inputs the graph writes in place (KV caches), read where they are: their
  addresses are baked into the graph and checked before every replay. One that moved makes that call run without
  the graph and the key capture again at the new address; an input that keeps moving stops being captured.
- every other tensor input copied into a buffer of the graph's own before each replay.
Outputs live in graph memory; the backend clones them out (`backend._copy_graph_outputs`), so a caller may keep
them across calls.

A graph that cannot be captured (an op tagged `cudagraph_unsafe`, a CPU tensor, or a capture that fails, e.g. on
a host sync) runs on PIECEWISE graphs instead, with one log line naming the op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from vgc import _compat
from vgc.config import CUDAGraphMode
from vgc.counters import counters
from vgc.cudagraph.captured import capture_graph, CapturedGraph, positions
from vgc.cudagraph.runtime import (bypass_piece_graphs, capture_failure, check_replay, GraphRuntime, paused_gc,
                                   piece_graphs_bypassed, ReplaySampler)

logger = logging.getLogger("vgc")

# A key whose inputs moved this many times stops being captured (each move costs a capture).
MAX_RECAPTURES = 3
# A move after this many replays of the graph does not count towards MAX_RECAPTURES: the capture paid for itself.
# transformers' generate() allocates a new StaticCache per call, so its K/V move once per generate() and then
# stay put for every decode step of it.
REPLAYS_PER_CAPTURE = 16
# Inputs the graph writes that are at most this large are copied in before each replay and back after it,
# instead of read in place: transformers' StaticCache replaces its small per-layer counters on every generate()
# while its K/V stay put, and reading them in place made every generate() capture again.
MIRROR_BYTES = 4096

class _NotCaptured:
    """A key's state before its capture (`seen` calls so far) or after giving up on it (`reason`)."""
    __slots__ = ("seen", "moves", "reason")

    def __init__(self, seen: int = 0, moves: int = 0, reason: str = ""):
        self.seen, self.moves, self.reason = seen, moves, reason


@dataclass(frozen=True)
class GraphInputs:
    """What the runner needs to know about a Dynamo graph's inputs, read once from the traced graph."""
    names: list[str]             # where Dynamo read each input, for messages
    pinned: list[int]            # weights, buffers and inputs written in place: read where they are
    copied: list[int]            # other tensors: copied into the graph's buffers
    mirrored: list[int]          # small tensors the graph writes: copied in, and the graph's copy back out
    scalars: list[int]           # non-tensor inputs (symbolic sizes among them): part of the key
    symbolic: list[int]          # the symbolic sizes, in graph order: the first one is "the size"
    shaped: list[int]            # tensors that are not model state: their shapes are part of the key

    @classmethod
    def of(cls, example_inputs: list, state: list[bool], mutated: set[int], names: list[str]) -> "GraphInputs":
        pinned, copied, mirrored, scalars = [], [], [], []
        for i, value in enumerate(example_inputs):
            if not isinstance(value, torch.Tensor):
                scalars.append(i)
            elif i in mutated and not state[i] and _small(value):
                mirrored.append(i)
            elif state[i] or i in mutated:
                pinned.append(i)
            else:
                copied.append(i)
        symbolic = [i for i in scalars if isinstance(example_inputs[i], torch.SymInt)]
        shaped = [i for i, value in enumerate(example_inputs) if isinstance(value, torch.Tensor) and not state[i]]
        return cls(names, pinned, copied, mirrored, scalars, symbolic, shaped)


def _small(value: torch.Tensor) -> bool:
    numel = value.numel()
    return isinstance(numel, int) and numel * value.element_size() <= MIRROR_BYTES


def full_graph_blocker(gm: fx.GraphModule) -> str | None:
    """Why no FULL graph can hold `gm`, read from the graph alone, or None. Ops that declare themselves unsafe
    (`torch.Tag.cudagraph_unsafe`) and CPU tensors beside CUDA ones (a graph would replay the CPU side's values
    of its capture) are caught here; a host sync inside an op shows only when its capture fails."""
    unsafe_tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    devices: dict[str, str] = {}
    for node in gm.graph.nodes:
        op = _compat.op_tags(node.target) if node.op == "call_function" else None
        if op is not None and unsafe_tag is not None and unsafe_tag in op[1]:
            return f"op {op[0]} is tagged cudagraph_unsafe"
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            devices.setdefault(value.device.type, node.name)
    if "cuda" in devices and "cpu" in devices:
        return f"{devices['cpu']} is a CPU tensor in a CUDA graph"
    return None


class DropInGraphs:
    """The FULL graphs of one Dynamo graph under drop-in `torch.compile(backend="vgc")`.

    `forward` is the split graph's forward, whose compiled pieces capture PIECEWISE graphs of their own unless
    `bypass_piece_graphs()` is on. Which calls get a FULL graph: those whose first symbolic size (in the order
    Dynamo's graph inputs introduce them: the token or batch dim of the first dynamic input) is a capture size;
    other symbolic sizes only tell signatures apart. A graph with no symbolic size has one signature, always
    captured. Other calls run PIECEWISE under FULL_AND_PIECEWISE and without graphs under FULL; calls whose
    capture failed run PIECEWISE in both modes.
    """

    def __init__(self, forward: Callable, inputs: GraphInputs, mode: CUDAGraphMode, runtime: GraphRuntime,
                 *, label: str, blocker: str | None = None):
        self.forward = forward
        self.inputs = inputs
        self.mode = mode
        self.runtime = runtime
        self.label = label
        self.entries: dict[tuple, CapturedGraph | _NotCaptured] = {}
        self._moves: dict[tuple, int] = {}   # per captured signature: how often its inputs moved soon after
        self._pinned_of = positions(inputs.pinned)
        self._copied_of = positions(inputs.copied + inputs.mirrored)
        self._mirrored_of = positions(inputs.mirrored)
        self._key_of = _key_function(inputs)
        self._told: set[str] = set()
        self._debug = ReplaySampler()
        # At most one FULL graph per capture size, as vgc.compile has: a shape with several symbolic sizes (batch
        # and sequence length) could otherwise fill GPU memory with a graph per sequence length.
        self.max_graphs = max(len(runtime.capture_sizes), 1)
        self.full_graphs = 0
        self.blocker = blocker
        if blocker is not None:
            self._tell(f"{label}: no FULL CUDA graph ({blocker}); it runs on PIECEWISE graphs")

    def __call__(self, *args):
        if piece_graphs_bypassed() or self.blocker is not None:
            return self.forward(*args)
        key = self._key_of(args)
        entry = self.entries.get(key)
        if entry.__class__ is CapturedGraph:
            moved = entry.moved(args)
            if moved is not None:
                return self._moved(key, entry, moved, args)
            entry.replay(args)
            counters.cudagraph_replays += 1
            if self.runtime.debug and self._debug.due(key):
                check_replay(entry.outputs, lambda: self.forward(*args), f"sizes {_sizes(key)} of {self.label}")
            return entry.outputs
        if entry is None:
            entry = self._new_signature(key) if self._qualifies(args) else None
            if entry is None:
                return self._without_full_graph("size", args)
        if entry.reason:
            return self._without_full_graph(entry.reason, args)
        entry.seen += 1
        if entry.seen == 1:   # the first call at a signature warms up (lazy kernel loading, autotuning)
            return self._without_full_graph("warm-up", args)
        return self._capture(key, entry, args)

    def _new_signature(self, key: tuple) -> _NotCaptured | None:
        """Start tracking a signature; None once `max_graphs` graphs exist. Signatures seen only once are
        forgotten first, so that shapes which never come back do not pile up."""
        if self.full_graphs >= self.max_graphs:
            self._tell(f"{self.label}: {self.full_graphs} FULL CUDA graphs captured, one per capture size; calls "
                       "of other shapes run without one")
            return None
        if len(self.entries) >= 2 * self.max_graphs:
            stale = next((k for k, e in self.entries.items() if e.__class__ is _NotCaptured and e.seen <= 1
                          and not e.reason), None)
            if stale is None:
                return None
            del self.entries[stale]
        entry = self.entries[key] = _NotCaptured()
        return entry

    def _qualifies(self, args) -> bool:
        symbolic = self.inputs.symbolic
        return not symbolic or args[symbolic[0]] in self.runtime.capture_sizes

    def _without_full_graph(self, why: str, args):
        """Calls FULL graphs do not serve: PIECEWISE graphs for a failed capture or under FULL_AND_PIECEWISE,
        else (FULL) the compiled pieces without graphs."""
        if why == "capture failed" or self.mode.has_piecewise:
            return self.forward(*args)
        counters.eager_runs += 1
        with bypass_piece_graphs():
            return self.forward(*args)

    def _capture(self, key: tuple, entry: _NotCaptured, args):
        inputs = list(args)
        copied = self.inputs.copied + self.inputs.mirrored
        for i in copied:
            inputs[i] = args[i].clone()
        try:
            with paused_gc(), bypass_piece_graphs():
                captured = capture_graph(lambda: self.forward(*inputs), self.runtime.pool(), replay=False,
                                         held=inputs, args=inputs,
                                         pinned_at=self.inputs.pinned, pinned_of=self._pinned_of,
                                         copy_targets=[inputs[i] for i in copied], copy_of=self._copied_of,
                                         mirror_targets=[inputs[i] for i in self.inputs.mirrored],
                                         mirror_of=self._mirrored_of)
        except Exception as error:   # noqa: BLE001 - any failure to capture means: run this signature piecewise
            entry.reason = "capture failed"
            self._tell(f"{self.label}: FULL CUDA graph capture failed at sizes {_sizes(key)} "
                       f"({capture_failure(error)}); that signature runs on PIECEWISE graphs")
            return self.forward(*args)
        outputs = captured.outputs
        copied_storages = {inputs[i].untyped_storage().data_ptr(): i for i in copied}
        out_tensors = [o for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
                       if isinstance(o, torch.Tensor)]
        for out in out_tensors:
            i = copied_storages.get(out.untyped_storage().data_ptr())
            if i is not None:   # replays would hand out the graph's input buffer, not a view of the caller's tensor
                entry.reason = "capture failed"
                self._tell(f"{self.label}: the graph returns a view of its input {self.inputs.names[i]}, which "
                           "a FULL graph reads from a copy; it runs on PIECEWISE graphs")
                return self.forward(*args)
        # Capturing only records: this call's results come from the first replay, and the mirrored inputs' writes
        # go back to the caller's tensors.
        captured.graph.replay()
        if captured.mirror_targets:
            _compat.copy_many(list(self._mirrored_of(args)), captured.mirror_targets)
        self.entries[key] = captured
        self._moves[key] = entry.moves
        pinned_storages = {t.untyped_storage().data_ptr() for t in self._pinned_of(inputs)}
        # Outputs that are views of the caller's own tensors (a KV cache) are theirs; the rest is graph memory.
        self.runtime.mark_stable(o for o in out_tensors if o.untyped_storage().data_ptr() not in pinned_storages)
        self.runtime.counters.add(cudagraph_captures=1)
        self.full_graphs += 1
        logger.debug("%s: captured a FULL graph at sizes %s (%d inputs copied in, %d copied in and out, %d read in "
                     "place)", self.label, _sizes(key), len(self.inputs.copied), len(self.inputs.mirrored),
                     len(self.inputs.pinned))
        return outputs

    def _moved(self, key: tuple, entry: CapturedGraph, moved: int, args):
        """A pinned input (the `moved`th) is not where the graph reads it: run without the graph, and capture
        again at the new address next time. A signature whose inputs move `MAX_RECAPTURES` times within
        `REPLAYS_PER_CAPTURE` replays of their capture stops being captured."""
        name = self.inputs.names[entry.pinned_at[moved]]
        moves = self._moves.pop(key, 0) + (entry.replays < REPLAYS_PER_CAPTURE)
        self.full_graphs -= 1   # its inputs and outputs are freed: the pool reuses their memory
        if moves > MAX_RECAPTURES:
            self.entries[key] = _NotCaptured(moves=moves, reason="moving inputs")
            self._tell(f"{self.label}: input {name} moved {moves} times at sizes {_sizes(key)}; that signature "
                       "now runs without a FULL graph (allocate KV caches once and pass the same tensors)")
        else:
            self.entries[key] = _NotCaptured(seen=1, moves=moves)
            self._tell(f"{self.label}: input {name} is not at the address its FULL CUDA graph read; that call "
                       "runs without the graph and the next one captures again", level=logging.INFO)
        counters.eager_runs += 1
        with bypass_piece_graphs():
            return self.forward(*args)

    def _tell(self, message: str, level: int = logging.WARNING) -> None:
        if message not in self._told:
            self._told.add(message)
            logger.log(level, "%s", message)


def _key_function(inputs: GraphInputs) -> Callable:
    """args -> the call's signature: its scalar inputs and the shapes of the tensors that are not model state
    (Dynamo's guards fix the rest)."""
    scalars = positions(inputs.scalars)
    shaped = positions(inputs.shaped)
    return lambda args: (tuple(scalars(args)), tuple(t.shape for t in shaped(args)))


def _sizes(key: tuple) -> str:
    scalars, shapes = key
    if scalars:
        return ", ".join(map(str, scalars))
    return ", ".join("x".join(map(str, s)) for s in shapes[:2]) or "()"
