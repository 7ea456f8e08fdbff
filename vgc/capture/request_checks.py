"""Per-call checks of request values the compiled code cannot survive: token ids outside an embedding table.

Eager `F.embedding` raises a catchable `IndexError` for an id outside the table. Inductor's code does not: on the
CPU its bounds check (`TORCH_CHECK`) runs inside an OpenMP region of the generated C++ kernel, where a C++
exception cannot unwind, so the process aborts (SIGABRT); on CUDA the Triton kernels are built with
`tl.device_assert` on, and a failing device assert leaves the CUDA context unusable for the rest of the
process. So before the compiled graph runs, the ids that go straight from a graph input into an embedding
lookup are checked on the host: one `torch.aminmax` per checked input (about 2 µs on the CPU).

On CUDA a few ids (a decode step's) come to the host whole, in one copy; more are reduced on the device and two
numbers come back. Either way the check waits for the GPU work queued before it. It is skipped while a
CUDA graph is being captured (no sync is allowed then; capture runs warm-up inputs). A FULL CUDA graph replayed
by `vgc.compile` does not call the backend's function: its dispatcher runs the same check by argument name
(`InputIdCheck.by_argument_name`), begun before the replay and ended after it (`ArgumentIdCheck.begin`): a decode
step's ids travel to pinned host memory ahead of the graph, and the host waits for that copy alone, not for the
GPU to go idle before it launches the graph. The refused call's output is never returned; since its graph ran,
the ids of every checked lookup are clamped into the table in the graph itself (`checker_for(..., bound=True)`),
so that no kernel reads outside it (a device assert leaves the CUDA context unusable); the refused call's KV
entries are written, at its own positions, where the next call at those positions writes them again.
`VGC_CHECK_INPUT_IDS=0` turns the check (and the clamp) off for callers that validate ids themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from vgc import cuda_runtime  # module attribute: tests substitute it
from vgc import _compat, envs
from vgc.aliasing import mutated_inputs
from vgc.capture.paths import resolve_source

# Embedding lookups as Dynamo (or a hand-made aten graph) records them, and where their indices are.
_INDEX_FIRST = {F.embedding}   # F.embedding(input, weight, ...)
_WEIGHT_FIRST = {torch.embedding, torch.ops.aten.embedding, torch.ops.aten.embedding.default}   # (weight, indices)

# Ops whose result holds exactly the values of their argument, each at least once: checking the argument checks
# the ids the lookup sees. Ops that select some elements (slicing, indexing) are not followed: checking the whole
# input there could refuse a request that eager accepts. Conversions are not followed either (`.int()` can wrap).
_SAME_VALUES = {"view", "reshape", "flatten", "ravel", "unflatten", "squeeze", "unsqueeze", "contiguous", "view_as",
                "reshape_as", "permute", "transpose", "t", "movedim", "expand", "expand_as", "alias", "detach"}


@dataclass(frozen=True)
class CheckedInput:
    position: int    # the graph input's position in the compiled function's arguments
    source: str      # where Dynamo read it, e.g. "L['input_ids']" ("" outside Dynamo)
    name: str        # for messages, e.g. "input_ids"
    table: str       # the embedding it indexes, for messages, e.g. "embed_tokens"
    rows: int        # valid ids are 0 .. rows - 1


class InputIdCheck:
    """Called with the compiled function's arguments; raises `IndexError` when an id is outside its table."""

    def __init__(self, checked: list[CheckedInput]):
        self.checked = tuple(checked)

    def __call__(self, args) -> None:
        for item in self.checked:
            _check_ids(item, args[item.position])

    def by_argument_name(self) -> "ArgumentIdCheck | None":
        """The same check on a call's bound arguments (name -> value), for callers that run the compiled code
        without its Dynamo arguments (a FULL CUDA graph replay). Ids are found where Dynamo read them: an
        argument, or a part of one (`L['batch']['ids']`). None when there is nothing to check."""
        readers = [(item, _argument_reader(item.source)) for item in self.checked
                   if item.source.startswith("L[")]   # "": not read from an argument
        return ArgumentIdCheck(readers) if readers else None


class ArgumentIdCheck:
    """`InputIdCheck` on bound arguments, the sources parsed once. Called, it checks at once; `begin` starts the
    check and returns what ends it, so that a FULL graph replays while a decode step's ids travel to the host.
    One check in flight at a time: the next `begin` reuses the host buffers (a dispatcher ends each check within
    its call)."""

    def __init__(self, readers: list[tuple[CheckedInput, Callable[[dict], Any]]]):
        self.readers = readers
        self._host: dict[tuple, torch.Tensor] = {}   # (checked input, ids, dtype) -> pinned buffer
        self._copied = None                           # a CUDA event, made at the first begun copy
        self._pending: list[tuple[CheckedInput, torch.Tensor]] = []

    def __call__(self, arguments: dict) -> None:   # per call: the sources were parsed once, in by_argument_name
        for item, read in self.readers:
            _check_ids(item, read(arguments))

    def begin(self, arguments: dict) -> Callable[[], None]:
        """Start the check: a decode step's few ids on CUDA are copied to pinned host memory without a wait; other
        ids are checked here, and a bad one refused at once. Returns the function that waits for that copy alone
        (not for the work queued after it) and raises as a call would. What runs before it must not read
        outside an embedding table on a bad id: the graphs vgc captures clamp them (`checker_for`)."""
        pending = self._pending
        pending.clear()
        for i, (item, read) in enumerate(self.readers):
            ids = read(arguments)
            if (isinstance(ids, torch.Tensor) and ids.is_cuda and 0 < ids.numel() <= _AS_LIST
                    and not cuda_runtime.stream_capturing()):
                key = (i, ids.numel(), ids.dtype)   # each checked input its own buffer: all copies are in flight
                host = self._host.get(key)
                if host is None:
                    # Pinned: a copy into pageable memory would wait for the GPU, as `tolist` does.
                    host = self._host[key] = torch.empty(ids.numel(), dtype=ids.dtype, pin_memory=True)
                host.copy_(ids if ids.dim() == 1 else ids.reshape(-1), non_blocking=True)
                pending.append((item, host))
            else:
                _check_ids(item, ids)
        if not pending:
            return _nothing_to_end
        if self._copied is None:
            self._copied = torch.cuda.Event()
        self._copied.record()
        return self._end

    def _end(self) -> None:
        self._copied.synchronize()
        for item, host in self._pending:   # cleared by the next begin
            values = host.tolist()
            _check_range(item, min(values), max(values))


def _nothing_to_end() -> None:
    pass


_ARGUMENT = re.compile(r"L\['(\w+)'\]")


def _argument_reader(source: str) -> Callable[[dict], Any]:
    """arguments -> the value Dynamo's `source` names: a plain dict lookup for a whole argument."""
    match = _ARGUMENT.fullmatch(source)
    if match:
        name = match[1]
        return lambda arguments: arguments.get(name)
    return lambda arguments: resolve_source(source, arguments)


_BOUND = "vgc_bound_ids"   # node meta of the clamp `checker_for(..., bound=True)` adds
_COPY_WHOLE = 4096   # ids up to this many are copied to the host and reduced there
_AS_LIST = 64        # up to this many, reduced in Python


def _check_ids(item: CheckedInput, ids) -> None:
    if not isinstance(ids, torch.Tensor) or ids.numel() == 0:   # aminmax refuses an empty tensor
        return
    if cuda_runtime.stream_capturing():   # a graph never replays a check: it would only break the capture
        return
    if ids.is_cuda and ids.numel() > _COPY_WHOLE:
        low, high = torch.stack(torch.aminmax(ids)).tolist()   # one device-to-host copy, not two
    elif ids.numel() <= _AS_LIST:
        # A decode step's ids (one per sequence): as a Python list, in one copy, with no op dispatched on the
        # host (a fifth of aminmax's host time per call).
        values = ids.tolist() if ids.dim() == 1 else ids.reshape(-1).tolist()
        low, high = min(values), max(values)
    else:
        # Fewer ids than _COPY_WHOLE come to the host whole: one copy and no kernel launch.
        low, high = (value.item() for value in torch.aminmax(ids.cpu()))
    _check_range(item, low, high)


def _check_range(item: CheckedInput, low: int, high: int) -> None:
    if low < 0 or high >= item.rows:
        raise IndexError(
            f"{item.name} holds ids in [{low}, {high}] but the embedding {item.table} has {item.rows} rows "
            f"(valid: 0..{item.rows - 1}); the request was not run. Pass ids from the model's own "
            "vocabulary (a tokenizer for another model, or padding with -1, gives such ids).")


def checker_for(gm: fx.GraphModule, example_inputs: list, bound: bool = False) -> InputIdCheck | None:
    """The check for `gm`'s inputs that feed embedding lookups, or None: nothing to check, or
    `VGC_CHECK_INPUT_IDS=0`. `bound`: also clamp the ids of every checked lookup into its table, in `gm` (a graph
    that may run before its check ends must never index outside a table); done once, a second call adds nothing."""
    if not envs.check_input_ids():
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {node: i for i, node in enumerate(placeholders)}
    written = mutated_inputs(gm)   # an input rewritten in the graph (ids masked in place) holds other values later
    found: dict[int, CheckedInput] = {}
    lookups = []
    for node in gm.graph.nodes:
        lookup = _embedding_lookup(gm, node, example_inputs, position)
        if lookup is None:
            continue
        index, table, rows = lookup
        direct = index
        while isinstance(index, fx.Node) and index.op != "placeholder" and (
                _op_name(index) in _SAME_VALUES or _BOUND in index.meta):   # vgc's own clamp: its input is checked
            index = index.args[0]
        i = position.get(index)
        value = example_inputs[i] if i is not None and i < len(example_inputs) else None
        if i is None or i in written or not _integer_tensor(value):
            continue
        lookups.append((node, direct, rows))
        source = _compat.placeholder_source_name(index)
        if i not in found or rows < found[i].rows:   # one input indexing several tables: the smallest bounds it
            found[i] = CheckedInput(i, source, _readable(source) or index.name, table, rows)
    if bound and sum(_clamp_index(gm, node, index, rows) for node, index, rows in lookups):
        gm.recompile()
    return InputIdCheck(list(found.values())) if found else None


def _clamp_index(gm: fx.GraphModule, lookup: fx.Node, index: fx.Node, rows: int) -> bool:
    """`lookup` reads `clamp(index, 0, rows - 1)` instead of `index`, in `gm`'s graph (the caller recompiles);
    False when it already does."""
    if not isinstance(index, fx.Node) or _BOUND in index.meta:
        return False
    with gm.graph.inserting_before(lookup):
        clamped = gm.graph.call_function(torch.clamp, (index, 0, rows - 1))
    clamped.meta[_BOUND] = rows   # not a user's clamp: the ids before it are the ones checked
    for key in ("example_value", "val", "tensor_meta"):   # the same shape and dtype as the ids
        if key in index.meta:
            clamped.meta[key] = index.meta[key]
    lookup.replace_input_with(index, clamped)
    return True


def checked(forward: Callable, check: InputIdCheck) -> Callable:
    """`forward`, run only after `check` passed on its arguments."""
    def call(*args):
        check(args)
        return forward(*args)
    return call


def _embedding_lookup(gm: fx.GraphModule, node: fx.Node, example_inputs: list, position: dict):
    """(index node, table name, rows) when `node` is an embedding lookup with a table of known size, else None."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        if not isinstance(module, torch.nn.Embedding):
            return None
        index = node.args[0] if node.args else node.kwargs.get("input")
        return index, str(node.target), module.num_embeddings
    if node.op != "call_function":
        return None
    if node.target in _INDEX_FIRST:
        index, weight = _arguments(node, ("input", "weight"))
    elif node.target in _WEIGHT_FIRST:
        weight, index = _arguments(node, ("weight", "indices"))
    else:
        return None
    shape = getattr(_value(gm, weight, example_inputs, position), "shape", None)
    if not shape or not isinstance(shape[0], int):   # a table with a symbolic size: nothing fixed to check against
        return None
    source = _compat.placeholder_source_name(weight) if isinstance(weight, fx.Node) else ""
    return index, _module_path(source) or getattr(weight, "name", "weight"), shape[0]


def _arguments(node: fx.Node, names: tuple[str, str]) -> tuple:
    return tuple(node.args[i] if i < len(node.args) else node.kwargs.get(name) for i, name in enumerate(names))


def _value(gm: fx.GraphModule, node, example_inputs: list, position: dict):
    """The (fake) tensor behind `node`: what Dynamo recorded, else the example input or the module attribute."""
    if not isinstance(node, fx.Node):
        return None
    value = _compat.traced_value(node)
    if value is None and position.get(node) is not None and position[node] < len(example_inputs):
        value = example_inputs[position[node]]
    if value is None and node.op == "get_attr":
        value = getattr(gm, node.target, None)   # a flat attribute name, as Dynamo writes them
    return value


def _integer_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() and \
        value.dtype != torch.bool


def _op_name(node: fx.Node) -> str | None:
    """The name of a tensor method, `torch.<name>` function or `aten::<name>` operator that `node` calls."""
    if node.op == "call_method":
        return node.target
    if node.op != "call_function":
        return None
    names = _compat.operator_names(node.target)
    if names:
        namespace, _, name = names[0].partition("::")
        return name if namespace == "aten" else None
    name = getattr(node.target, "__name__", None)
    return name if name and getattr(torch, name, None) is node.target else None


def _readable(source: str) -> str:
    """"L['input_ids']" -> "input_ids", "L['args'][1]" -> "args[1]": the argument as the caller wrote it."""
    match = re.fullmatch(r"L\['(\w+)'\](.*)", source)
    return match.group(1) + match.group(2) if match else source


def _module_path(source: str) -> str:
    """"L['self']._modules['model']._modules['embed_tokens']._parameters['weight']" -> "model.embed_tokens"."""
    return ".".join(re.findall(r"_modules\['([^']+)'\]", source))
