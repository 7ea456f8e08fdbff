"""Split a Dynamo FX graph at splitting ops (attention) into pieces that compile and pieces that run eagerly.

It also owns what a user needs to get the splitting ops right: a name torch does not know as an operator is an
error, and the graph's attention-like ops are what vgc suggests when none of the configured ops occurs.
"""

from __future__ import annotations

import collections
import difflib
import logging
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from vgc import _compat, aliasing
from vgc import ops as _ops  # noqa: F401  (registers vgc::attention, the default splitting op)

logger = logging.getLogger("vgc")


@dataclass
class Piece:
    name: str             # attribute name of the submodule in the split module ("submod_3")
    index: int
    is_splitting: bool    # True: runs eagerly (an attention op); False: compiled by Inductor
    module: fx.GraphModule


def op_names(node: fx.Node) -> tuple[str, ...]:
    """The operator names a node answers to: 'ns::op' and, for an overload, 'ns::op.overload'."""
    target = node.target
    if node.op == "call_function":
        names = _compat.operator_names(target)
        if names:
            return names
        # Dynamo records torch-level functions (F.scaled_dot_product_attention); they answer to their aten name.
        name = getattr(target, "__name__", None)
        if name and (_compat.qualified_name(target) or "").startswith("torch.") and hasattr(torch.ops.aten, name):
            return (f"aten::{name}",)
    elif node.op == "call_method" and hasattr(torch.ops.aten, str(target)):
        return (f"aten::{target}",)
    return ()


def is_splitting_node(node: fx.Node, splitting_ops: frozenset[str]) -> bool:
    return any(name in splitting_ops for name in op_names(node))


def _resolve(name: str):
    """The operator (overload packet or overload) torch knows as `ns::op` or `ns::op.overload`, else None."""
    namespace, _, rest = name.partition("::")
    op, dot, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        if not dot:
            return packet
        return getattr(packet, overload) if overload else None   # 'ns::op.' would never match a node
    except (AttributeError, RuntimeError):
        return None


def _known_names(name: str, gm: fx.GraphModule) -> list[str]:
    """Names to suggest for a misspelt op: the graph's own ops, those of the namespace torch has loaded and, when
    the op exists, its overloads."""
    namespace, _, rest = name.partition("::")
    loaded = getattr(torch.ops, namespace)
    names = {f"{namespace}::{op}" for op in dir(loaded) if not op.startswith("__") and callable(getattr(loaded, op))}
    base = f"{namespace}::{rest.partition('.')[0]}"
    packet = _resolve(base)
    if packet is not None:
        names.update(f"{base}.{overload}" for overload in packet.overloads())
    return sorted(names.union(*(op_names(node) for node in gm.graph.nodes)))


def check_splitting_ops(splitting_ops: list[str], gm: fx.GraphModule) -> None:
    """Raise `ValueError` for a splitting op torch does not know: it could never match, and the graph would run
    as one piece without a word. Checked when a graph is compiled, not when the config is built, because a
    custom op's module may be imported in between."""
    for op in splitting_ops:
        if _resolve(op) is not None:
            continue
        close = difflib.get_close_matches(op, _known_names(op, gm), n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"splitting_ops: {op!r} is not an operator torch knows{hint}; give a registered operator "
                         "as 'namespace::op' or 'namespace::op.overload', and import the module that registers a "
                         "custom op before the model is compiled")


def attention_like_ops(gm: fx.GraphModule) -> collections.Counter[str]:
    """The graph's ops whose name says attention ("attention", "attn"), by operator name, with their counts:
    the ops to split at when none of the configured splitting ops occurs."""
    found: collections.Counter[str] = collections.Counter()
    for node in gm.graph.nodes:
        names = op_names(node)
        if names and ("attention" in names[0] or "attn" in names[0]):
            found[names[0]] += 1
    return found


SDPA = "aten::scaled_dot_product_attention"
_MATMULS = {"aten::matmul", "aten::bmm", "aten::einsum"}


def eager_attention_count(gm: fx.GraphModule) -> int:
    """How many softmaxes of a product of two computed tensors (`softmax(q @ k.T * scale + mask)`, soft-capping
    included) the graph has: attention written out in plain ops, which no splitting op can split at."""
    def computed_matmul(node, depth=0) -> bool:
        if not isinstance(node, fx.Node) or depth > 6 or node.op not in ("call_function", "call_method"):
            return False
        if set(op_names(node)) & _MATMULS or node.target is operator.matmul:
            return all(isinstance(a, fx.Node) and a.op != "placeholder" for a in node.args[:2])
        return bool(node.args) and computed_matmul(node.args[0], depth + 1)

    return sum(1 for node in gm.graph.nodes if {"aten::softmax", "aten::_softmax"} & set(op_names(node))
               and node.args and computed_matmul(node.args[0]))


def sdpa_reads_a_kv_cache(gm: fx.GraphModule) -> bool:
    """Whether some SDPA call of the graph has another number of keys than of queries: a decode step reading a
    KV cache (or cross-attention). Unsplit, such a graph is one piece whose shapes follow the KV length, so it
    would get a new size, and no graph, on every decode step."""
    for node in gm.graph.nodes:
        if SDPA not in op_names(node):
            continue
        query = node.args[0] if node.args else node.kwargs.get("query")
        key = node.args[1] if len(node.args) > 1 else node.kwargs.get("key")
        values = [_compat.traced_value(n) if isinstance(n, fx.Node) else None for n in (query, key)]
        if all(isinstance(v, torch.Tensor) and v.dim() >= 2 for v in values) and \
                str(values[0].shape[-2]) != str(values[1].shape[-2]):   # compared as expressions: no guard
            return True
    return False


def decompose_size_nodes(gm: fx.GraphModule) -> None:
    """Replace whole `x.size()` values by per-dim values: a torch.Size cannot cross a piece boundary."""
    graph = gm.graph
    for node in list(graph.nodes):
        is_size = (node.op == "call_method" and node.target == "size" and len(node.args) == 1 and not node.kwargs)
        if not is_size:
            continue
        value = _compat.traced_value(node)
        if not isinstance(value, torch.Size):
            continue
        tensor = node.args[0]
        dims = []
        with graph.inserting_after(node):
            for i, d in enumerate(value):
                if isinstance(d, torch.SymInt):
                    dim_node = graph.call_function(torch.ops.aten.sym_size.int, (tensor, i))
                    _compat.set_traced_value(dim_node, d)
                    dims.append(dim_node)
                else:
                    dims.append(int(d))
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
                _replace_uses(user, dims[user.args[1]])
                graph.erase_node(user)
            else:
                _replace_uses_in(user, node, list(dims))
        graph.erase_node(node)
    gm.recompile()


def _replace_uses(node: fx.Node, replacement) -> None:
    """Like `replace_all_uses_with`, but the replacement may be a plain int or a list."""
    for user in list(node.users):
        _replace_uses_in(user, node, replacement)


def _replace_uses_in(user: fx.Node, node: fx.Node, replacement) -> None:
    def substitute(value):
        return replacement if value is node else value

    user.args = fx.node.map_aggregate(user.args, substitute)
    user.kwargs = fx.node.map_aggregate(user.kwargs, substitute)


def _is_basic_index(value) -> bool:
    """Indices that make a view (ints, slices, None, ...), not a copy (tensor indexing)."""
    if isinstance(value, (tuple, list)):
        return all(_is_basic_index(v) for v in value)
    if isinstance(value, slice):
        return all(_is_basic_index(v) for v in (value.start, value.stop, value.step))
    return value is None or value is Ellipsis or (isinstance(value, int) and not isinstance(value, bool))


def _is_view_of(node: fx.Node, base) -> bool:
    """A certain view of `base` whose other arguments are constants (a tensor index makes `base[i]` a copy)."""
    return aliasing.is_view(node) and node.args[0] is base and \
        _is_basic_index((node.args[1:], tuple(node.kwargs.values())))


def _move_input_views_to_their_splitting_piece(gm: fx.GraphModule, partition: dict, splitting_ids: set) -> None:
    """Views of graph inputs used only by one splitting piece (`kv_cache[0]` feeding attention) move into it.

    Otherwise a compiled piece would return a view of the KV cache: CUDA graphs of that piece would then pin
    the cache's address, and the view would cross a piece boundary for nothing. Only true views move (they
    read their base when used, so creating them later changes nothing), and they move in the graph too, right
    before their first user, so that pieces still run in order.
    """
    input_views = []
    for node in gm.graph.nodes:
        base = node.args[0] if node.args else None
        if isinstance(base, fx.Node) and (base.op == "placeholder" or base in input_views) and \
                _is_view_of(node, base):
            input_views.append(node)
    for node in reversed(input_views):  # users first, so chains of views move together
        targets = {partition.get(user) for user in node.users}
        if len(targets) == 1:
            target = targets.pop()
            if target in splitting_ids:
                partition[node] = target
                first_user = min(node.users, key=_position(gm))
                first_user.prepend(node)


def _symbols(value) -> set:
    """The free symbols of a traced value: a tensor's sizes, or a symbolic int."""
    if isinstance(value, torch.Tensor):
        return set().union(*(d.node.expr.free_symbols for d in value.shape if isinstance(d, torch.SymInt)))
    if isinstance(value, torch.SymInt):
        return set(value.node.expr.free_symbols)
    return set()


def is_model_state(node: fx.Node, value) -> bool:
    """The graph input is one of the model's weights or buffers: its address never changes."""
    name = _compat.placeholder_source_name(node)
    return isinstance(value, torch.nn.Parameter) or "_parameters[" in name or "_buffers[" in name


def _leading_symbols(gm: fx.GraphModule) -> set | None:
    """The symbols of the first tensor input that is not a weight or buffer (the tokens, in a language model):
    the sizes compiled pieces are meant to follow. None for a graph without traced values."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = _compat.traced_value(node)
        if isinstance(value, torch.Tensor) and not is_model_state(node, value):
            return _symbols(value)
    return None


def _move_other_sizes_to_their_splitting_piece(gm: fx.GraphModule, partition: dict, splitting_ids: set) -> None:
    """Work whose shape follows another size than the leading input's, done only for splitting ops (and the
    graph's outputs), moves into the splitting piece that first needs it.

    In a decode step on transformers' dynamic cache the tokens' shape is fixed and the KV length grows every
    step: the cache update (`torch.cat` of past and new K/V) and the attention mask follow the KV length and
    feed only attention. Run eagerly beside attention, they leave the compiled pieces with the tokens' sizes
    alone, so their piece graphs replay whatever the KV length. Projections and everything else the compiled
    pieces compute stay where they are: their shapes follow the tokens. Moved nodes go right before their first
    user in the graph, so that pieces still run in order.
    """
    leading = _leading_symbols(gm)
    if leading is None:
        return
    for node in reversed(list(gm.graph.nodes)):
        # Dynamo leaves unused size arithmetic (`keys.numel()` of transformers' cache, a `sym_sum` of lengths):
        # it has no effect, but would make a compiled piece take the other size as an input.
        value = _compat.traced_value(node)
        if node.op in ("call_function", "call_method") and not node.users and isinstance(value, torch.SymInt) \
                and _symbols(value) - leading:
            gm.graph.erase_node(node)
            partition.pop(node, None)
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]

    def other_sizes(node) -> bool:
        if _symbols(_compat.traced_value(node)) - leading:
            return True   # its shape (or its value, a size) follows another size
        # A tensor of fixed shape made from another size (`torch.arange(past, past + 1)`) follows it too.
        return any(isinstance(a, fx.Node) and isinstance(_compat.traced_value(a), torch.SymInt) and
                   _symbols(_compat.traced_value(a)) - leading for a in node.all_input_nodes)

    def whole(node) -> bool:   # a tuple and its items stay together
        producer = node.args[0] if node.args else None
        return isinstance(_compat.traced_value(node), (tuple, list)) or (
            node.target is operator.getitem and isinstance(producer, fx.Node) and
            isinstance(_compat.traced_value(producer), (tuple, list)))

    # What is made only from such work follows it too: transformers' mask builds its index tensors from a
    # constant `arange(batch)` and an `arange(1) + past`, and a `new_ones(())` of one of them. Left behind, they
    # would make the compiled piece take the KV length as an input and dispatch on it every step.
    follows: set[fx.Node] = set()
    for node in nodes:
        if other_sizes(node) or all(a in follows for a in node.all_input_nodes):
            follows.add(node)
    target: dict[fx.Node, int] = {}
    for node in reversed(nodes):   # users first
        if partition.get(node) in splitting_ids or whole(node) or node not in follows:
            continue
        wanted = set()
        for user in node.users:
            if user.op == "output":
                continue
            part = target.get(user, partition.get(user))
            if part not in splitting_ids:
                wanted = None
                break
            wanted.add(part)
        if wanted and min(wanted) >= partition[node]:
            target[node] = min(wanted)
    if not target:
        return
    position = _position(gm)
    for node in sorted(target, key=position, reverse=True):   # users first, so chains move together
        partition[node] = target[node]
        first_user = min((u for u in node.users if u.op != "output"), key=_position(gm))
        first_user.prepend(node)
    logger.debug("%d nodes whose shapes follow another size than the leading input's run with attention",
                 len(target))


def _position(gm: fx.GraphModule):
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return order.__getitem__


def as_laid_out(x: torch.Tensor, order: tuple[int, ...] | None) -> torch.Tensor:
    """`x` in the dense layout the compiled piece reading it was built for (dims outermost first in `order`;
    None: the standard contiguous one), copied only when it is not."""
    if isinstance(x, fx.Proxy):   # FX re-traces a saved split graph as it unpickles it: record the call
        return x.tracer.create_proxy("call_function", as_laid_out, (x, order), {})
    if order is None:
        return x if x.is_contiguous() else x.contiguous()
    if x.permute(order).is_contiguous():
        return x
    return torch.empty_permuted(x.shape, order, dtype=x.dtype, device=x.device).copy_(x)


def _dense_order(value: torch.Tensor):
    """The order of `value`'s dims, outermost first, if its traced layout is dense (None when that is the
    contiguous one); False for a layout no copy gives (a slice of a larger buffer) or sizes without a hint."""
    hints = [_compat.size_hint(d) for d in (*value.shape, *value.stride())]
    if any(h is None for h in hints):
        return False
    sizes, strides = hints[:value.dim()], hints[value.dim():]
    order = sorted(range(value.dim()), key=lambda d: (-strides[d], d))
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return False
        expected *= sizes[d]
    significant = [d for d in order if sizes[d] != 1]
    return None if significant == sorted(significant) else tuple(order)


def lay_out_eager_results(split_gm: fx.GraphModule, pieces: list[Piece], piece_inputs: dict[str, tuple],
                          mutated: dict[str, frozenset[int]]) -> int:
    """Hand each compiled piece the eager pieces' results in the layout it was compiled for; returns how many
    edges got the check.

    Inductor builds a piece for its inputs' traced strides and asserts them on every call. An eager piece's
    results have the strides its kernels choose at run time, which need not be those its fake kernels gave the
    trace: Phi3's attention output comes back [batch, tokens, heads, dim]-major from SDPA's CPU kernel where the
    trace said contiguous. Inputs a piece writes in place are left alone (a copy would lose the write)."""
    eager = {p.name for p in pieces if p.is_splitting}
    compiled = {p.name for p in pieces if not p.is_splitting}
    graph, checked = split_gm.graph, 0

    def from_eager(arg) -> bool:
        producer = arg.args[0] if arg.op == "call_function" and arg.target is operator.getitem else arg
        return isinstance(producer, fx.Node) and producer.op == "call_module" and producer.target in eager

    for call in list(graph.nodes):
        if call.op != "call_module" or call.target not in compiled or call.target not in piece_inputs:
            continue
        args = list(call.args)
        for i, (arg, value) in enumerate(zip(call.args, piece_inputs[call.target])):
            if not isinstance(arg, fx.Node) or not from_eager(arg) or not isinstance(value, torch.Tensor) or \
                    i in mutated.get(call.target, ()):
                continue
            order = _dense_order(value)
            if order is not False:
                with graph.inserting_before(call):
                    args[i] = graph.call_function(as_laid_out, (arg, order))
                checked += 1
        call.args = tuple(args)
    if checked:
        split_gm.recompile()
    return checked


def split_graph(gm: fx.GraphModule, splitting_ops: list[str]) -> tuple[fx.GraphModule, list[Piece]]:
    """Split `gm` so that each run of consecutive splitting ops is its own piece, in original order."""
    ops = frozenset(splitting_ops)
    if ops:
        decompose_size_nodes(gm)
    partition: dict[fx.Node, int] = {}
    splitting_ids: set[int] = set()
    current, current_used = 0, False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        producer = node.args[0] if node.args else None
        if node.op == "call_function" and node.target is operator.getitem and isinstance(producer, fx.Node) \
                and producer in partition and isinstance(_compat.traced_value(producer), (tuple, list)):
            # A whole tuple never crosses a boundary: its items stay with the node that made it.
            partition[node] = partition[producer]
            continue
        if is_splitting_node(node, ops):
            if current not in splitting_ids:
                if current_used:
                    current += 1
                splitting_ids.add(current)
        elif current in splitting_ids:
            current += 1
        partition[node] = current
        current_used = True
    _move_input_views_to_their_splitting_piece(gm, partition, splitting_ids)
    if splitting_ids:
        _move_other_sizes_to_their_splitting_piece(gm, partition, splitting_ids)
    split_gm = _compat.split_module(gm, partition)
    pieces = []
    for name, module in split_gm.named_children():
        index = int(name.rsplit("_", 1)[1])
        pieces.append(Piece(name, index, index in splitting_ids, module))
    pieces.sort(key=lambda p: p.index)
    return split_gm, pieces
