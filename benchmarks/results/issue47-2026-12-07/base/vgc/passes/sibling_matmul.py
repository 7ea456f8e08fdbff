"""Sibling-matmul fusion: linears that read the same input and whose weights are the model's parameters become
one linear over the weights laid end to end, its output narrowed back into the original results.

A transformers Llama runs q/k/v and gate/up as separate matmuls on one input; at decode sizes each is a small,
memory-bound GEMM, and one wide GEMM reads the same bytes with fewer kernels. The fused weight must not be
concatenated per call (a copy of every weight, every step) nor baked into the artifact (weights in the cache), so
this pass cannot run inside Inductor: it rewrites the split graph before any piece compiles. The compiled piece
takes the fused weight as an input, and the split graph (plain Python, not compiled) makes it with
`fused_weight(*parts)`:

- the first call concatenates the parts once and rebinds each parameter's `.data` to its rows of the result, so
  the model keeps one copy of its weights and `state_dict()`, `load_state_dict()` and in-place updates still go
  to the right rows;
- later calls find the parts laid end to end in one storage and return a view over them (a few address reads);
- a part that moved (a parameter replaced after compiling) makes the call concatenate without rebinding: correct,
  slower, and said once in a warning.
"""

from __future__ import annotations

import collections
import logging
import weakref
from dataclasses import dataclass

import torch
import torch.fx as fx

from vgc import _compat, aliasing
from vgc.aliasing import written_arguments
from vgc.cuda_runtime import stream_capturing

logger = logging.getLogger("vgc")

_LINEAR_TARGETS = (torch.nn.functional.linear, torch.ops.aten.linear.default)   # F.linear is what Dynamo records

# id(parts[0]) -> (a weak reference to parts[0], the fused view, every part's address): the fast path's answer for
# a group laid out by `fused_weight`; an entry leaves with its first part. A plain dict keyed by id, because the
# fast path runs once per group per call in host-bound modes, and a weak-keyed dictionary costs microseconds.
_laid_out: dict[int, tuple[weakref.ref, torch.Tensor, tuple[int, ...]]] = {}
_data_ptr = torch.Tensor.data_ptr
_warned_moved = False


def fused_weight(*parts: torch.Tensor) -> torch.Tensor:
    """The parts (2-D weights with equal columns, or 1-D biases) as one tensor, rows end to end; see the module's
    docstring for when it copies."""
    known = _laid_out.get(id(parts[0]))
    if known is not None and known[0]() is parts[0] and tuple(map(_data_ptr, parts)) == known[2]:
        return known[1]
    return _fuse(parts)


def _fuse(parts) -> torch.Tensor:
    first = parts[0]
    if isinstance(first, fx.Proxy):   # FX re-traces a saved split graph as it unpickles it: record the call
        return first.tracer.create_proxy("call_function", fused_weight, parts, {})
    if _compat.is_fake(first):   # planning: only the shape matters
        return torch.cat(parts)
    fused = _view_of_laid_out(parts)
    if fused is None:
        # Rebound parameters keep their kind: ordinary tensors stay ordinary even when called in inference mode.
        with torch.no_grad(), torch.inference_mode(first.is_inference()):
            fused = torch.cat(parts)
        if stream_capturing() or not all(_owns_its_storage(p) for p in parts):
            # A capture would rebind the weights to graph memory; shared storage means a part moved after
            # fusing (or another group fused it differently): never rebind twice, copy per call instead.
            _warn_moved(parts)
            return fused
        rows = 0
        for part in parts:
            part.data = fused[rows:rows + part.shape[0]]
            rows += part.shape[0]
    key = id(first)
    _laid_out[key] = (weakref.ref(first, lambda _, key=key: _laid_out.pop(key, None)), fused,
                      tuple(map(_data_ptr, parts)))
    return fused


def _owns_its_storage(part: torch.Tensor) -> bool:
    return part.storage_offset() == 0 and part.untyped_storage().nbytes() == part.numel() * part.element_size()


def _view_of_laid_out(parts) -> torch.Tensor | None:
    """A view over `parts` when they already lie end to end in one storage, contiguous, else None."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    offset = first.storage_offset()
    for part in parts:
        if part.untyped_storage().data_ptr() != storage or part.storage_offset() != offset or \
                not part.is_contiguous() or part.dtype != first.dtype or part.shape[1:] != first.shape[1:]:
            return None
        offset += part.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _warn_moved(parts) -> None:
    global _warned_moved
    if not _warned_moved:
        _warned_moved = True
        logger.warning("fused weights (%d parts of shape %s) no longer lie together: a parameter was replaced "
                       "after compiling, so each call now concatenates them (correct, but slower). Update weights "
                       "in place (load_state_dict, copy_) or switch the pass off with pass_config="
                       "{'fuse_sibling_matmuls': False}", len(parts), tuple(parts[0].shape))


@dataclass
class _Member:
    node: fx.Node          # the linear
    weight: fx.Node        # its weight placeholder in the piece
    bias: fx.Node | None


def _linear_arguments(node: fx.Node):
    """(input, weight, bias) of a linear node, else None."""
    if node.op != "call_function" or node.target not in _LINEAR_TARGETS:
        return None
    names = ("input", "weight", "bias")
    values = dict(zip(names, node.args))
    for name in names:
        if name in node.kwargs:
            values[name] = node.kwargs[name]
    if len(node.args) > 3 or set(node.kwargs) - set(names) or "weight" not in values:
        return None
    return values.get("input"), values["weight"], values.get("bias")


def _groups(module: fx.GraphModule, state_value: dict[fx.Node, torch.Tensor]) -> list[list[_Member]]:
    """Linears of `module` that share an input and read weights (and biases, all or none) that are parameters
    used nowhere else, with equal columns, dtype and device: each group of two or more can be fused."""
    by_input: dict[fx.Node, list[_Member]] = collections.defaultdict(list)
    for node in module.graph.nodes:
        found = _linear_arguments(node)
        if found is None:
            continue
        x, weight, bias = found
        if isinstance(x, fx.Node) and _is_parameter(weight, state_value, dim=2) and \
                (bias is None or _is_parameter(bias, state_value, dim=1)):
            by_input[x].append(_Member(node, weight, bias))
    groups = []
    for x, members in by_input.items():
        first = state_value[members[0].weight]
        members = [m for m in members if _compatible(state_value[m.weight], first)]
        if len(members) >= 2 and _written_between(module, x, members[0].node, members[-1].node):
            continue   # the fused linear, at the first one's place, would read x before the write
        if len(members) < 2 or len({m.bias is None for m in members}) != 1:
            continue
        if members[0].bias is not None and any(state_value[m.bias].shape[0] != state_value[m.weight].shape[0]
                                               for m in members):
            continue
        groups.append(members)
    return groups


def _written_between(module: fx.GraphModule, x: fx.Node, first: fx.Node, last: fx.Node) -> bool:
    """Some node from `first` to `last` writes in place to `x` or to a tensor sharing its storage (conservatively:
    any in-place write to a tensor whose storage base is x's, or whose base is unknown)."""
    base = aliasing.storage_base(x)
    between = False
    for node in module.graph.nodes:
        between = between or node is first
        if between and any(isinstance(a, fx.Node) and aliasing.storage_base(a) in (base, None)
                           for a in written_arguments(node)):
            return True
        if node is last:
            return False
    return False


def _is_parameter(node, state_value: dict, dim: int) -> bool:
    value = state_value.get(node)
    return value is not None and len(node.users) == 1 and value.dim() == dim and value.is_contiguous() and \
        all(isinstance(d, int) for d in value.shape)


def _compatible(weight: torch.Tensor, first: torch.Tensor) -> bool:
    return weight.shape[1] == first.shape[1] and weight.dtype == first.dtype and weight.device == first.device


def _rewrite(module: fx.GraphModule, groups: list[list[_Member]], state_value: dict) -> tuple[fx.GraphModule, list]:
    """A copy of `module` with each group fused; returns it and, per new input, the placeholders it replaces (the
    new inputs come last, in that order)."""
    graph = fx.Graph()
    mapping: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(module.graph, mapping))
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
    replaced = []
    for index, members in enumerate(groups):
        old_inputs = [[m.weight for m in members]]
        if members[0].bias is not None:
            old_inputs.append([m.bias for m in members])
        new_inputs = []
        for kind, parts in zip(("weight", "bias"), old_inputs):
            with graph.inserting_after(last_input):
                last_input = graph.placeholder(f"fused_{kind}_{index}")
            new_inputs.append(last_input)
            replaced.append(parts)
        linears = [mapping[m.node] for m in members]
        x = _linear_arguments(linears[0])[0]
        with graph.inserting_before(linears[0]):
            fused = graph.call_function(linears[0].target, (x, *new_inputs))
            start = 0
            for linear, member in zip(linears, members):
                rows = state_value[member.weight].shape[0]
                linear.replace_all_uses_with(graph.call_function(torch.narrow, (fused, -1, start, rows)))
                start += rows
        for linear in linears:
            graph.erase_node(linear)
        for parts in old_inputs:
            for part in parts:
                graph.erase_node(mapping[part])
    graph.lint()
    return fx.GraphModule(module, graph), replaced


def fuse_sibling_linears(split_gm: fx.GraphModule, pieces: list, piece_inputs: dict[str, tuple],
                         module_state: dict[str, list[bool]], fake_mode) -> int:
    """Fuse sibling linears in every compiled piece of `split_gm` (in place); returns the number of groups fused.

    Each rewritten piece is checked first on its fake inputs (a result narrowed out of a wider one is not
    contiguous, and a later `view` might refuse it); a piece that fails keeps its linears.
    """
    if fake_mode is None:   # real inputs: a trial run would rebind the model's weights
        return 0
    calls = {n.target: n for n in split_gm.graph.nodes if n.op == "call_module"}
    total = 0
    for piece in pieces:
        if piece.is_splitting or piece.name not in piece_inputs:
            continue
        placeholders = [n for n in piece.module.graph.nodes if n.op == "placeholder"]
        values = piece_inputs[piece.name]
        call = calls[piece.name]
        state_value = {node: value for node, value, is_state, outer in
                       zip(placeholders, values, module_state[piece.name], call.args)
                       if is_state and isinstance(value, torch.Tensor) and isinstance(outer, fx.Node)
                       and outer.op == "placeholder"}
        groups = _groups(piece.module, state_value)
        if not groups:
            continue
        module, replaced = _rewrite(piece.module, groups, state_value)
        position = {node: i for i, node in enumerate(placeholders)}
        gone = {node for parts in replaced for node in parts}
        kept = [i for i, node in enumerate(placeholders) if node not in gone]
        with fake_mode:
            fused_values = [torch.cat([values[position[p]] for p in parts]) for parts in replaced]
        trial_inputs = [values[i] for i in kept] + fused_values
        try:
            with _compat.fake_propagation(fake_mode):   # as Dynamo propagates: no size of the trace gets pinned
                _record_values(module, trial_inputs)
        except Exception as error:   # noqa: BLE001 - any failure means: leave this piece as it was
            logger.debug("%s: sibling linears left unfused (%s: %s)", piece.name, type(error).__name__, error)
            continue
        with split_gm.graph.inserting_before(call):
            fused_args = [split_gm.graph.call_function(fused_weight, tuple(call.args[position[p]] for p in parts))
                          for parts in replaced]
        call.args = tuple(call.args[i] for i in kept) + tuple(fused_args)
        setattr(split_gm, piece.name, module)
        piece.module = module
        total += len(groups)
    if total:
        split_gm.recompile()
        logger.debug("fused %d groups of sibling linears", total)
    return total


def _record_values(module: fx.GraphModule, inputs: list) -> None:
    """Run `module` on fake inputs, keeping each node's result as Dynamo does (`example_value`)."""
    class Recorder(fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            node.meta.setdefault("example_value", result)
            return result

    Recorder(module).run(*inputs)


def is_fused_weight(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is fused_weight
