"""Which FX nodes alias or write their inputs: views of their first argument (one table for every reader of it),
in-place writes, and the graph inputs a graph writes.

Splitting moves graph inputs' views into the eager piece that uses them, which is safe only for results that
certainly are views. The CUDA-graph pieces look for inputs written through views, which must count every result
that may share its argument's storage (a missed one makes a captured graph write a copy, and the write is lost).
"""

from __future__ import annotations

import builtins
import operator

import torch
import torch.fx as fx

from vgc import _compat

# Op name (a tensor method, `torch.<name>` or `aten::<name>`; for `getattr` nodes, the attribute) -> True when the
# result is always a single tensor viewing its first argument (`__getitem__`: given basic indices, which the
# caller checks); False when it may share the argument's storage but need not (a reshape copies when the strides
# forbid a view, a conversion returns its argument when there is nothing to convert) or is a tuple of views.
VIEW_OPS: dict[str, bool] = {
    **dict.fromkeys(["__getitem__", "adjoint", "alias", "as_strided", "detach", "diagonal", "expand",
                     "expand_as", "imag", "movedim", "moveaxis", "narrow", "permute", "real", "select", "slice",
                     "squeeze", "swapaxes", "swapdims", "t", "transpose", "unflatten", "unfold", "unsqueeze",
                     "view", "view_as", "view_as_complex", "view_as_real", "H", "mH", "mT", "T"], True),
    **dict.fromkeys(["chunk", "dsplit", "hsplit", "split", "split_with_sizes", "tensor_split", "unbind", "vsplit",
                     "bfloat16", "bool", "byte", "char", "contiguous", "cpu", "cuda", "double", "flatten", "float",
                     "half", "int", "long", "ravel", "reshape", "reshape_as", "short", "to", "type", "type_as"],
                    False),
}


def is_view(node: fx.Node) -> bool:
    """The node's result is a single tensor that always views `node.args[0]` (given basic-index arguments)."""
    return _lookup(node) is True


def may_be_view(node: fx.Node) -> bool:
    """The node's result may share `node.args[0]`'s storage."""
    return _lookup(node) is not None


def storage_base(node):
    """The node whose storage `node` may share: followed back through every possible view, stopping at a
    conversion that provably copied. A placeholder result means the value may alias a graph input."""
    while isinstance(node, fx.Node) and node.op != "placeholder" and node.args and may_be_view(node) \
            and not _is_conversion_copy(node):
        node = node.args[0]
    return node


def _is_conversion_copy(node: fx.Node) -> bool:
    """A conversion (`x.float()`, `x.to(...)`) whose traced result has another dtype or device than its input is
    a copy: writing it leaves the input alone."""
    result, source = _compat.traced_value(node), _compat.traced_value(node.args[0])
    return isinstance(result, torch.Tensor) and isinstance(source, torch.Tensor) and \
        (result.dtype != source.dtype or result.device != source.device)


def _lookup(node: fx.Node) -> bool | None:
    target = node.target
    if node.op == "call_method":
        return VIEW_OPS.get(target)
    if node.op != "call_function":
        return None
    if target is operator.getitem:
        return VIEW_OPS["__getitem__"]
    if target is builtins.getattr:   # Dynamo records `x.T` as getattr(x, "T")
        attribute = node.args[1] if len(node.args) > 1 else None
        return VIEW_OPS.get(attribute) if isinstance(attribute, str) else None
    name = _torch_name(target)
    if name is not None:
        return VIEW_OPS.get(name)
    # Another callable merely named like a view op (a custom op "ns::view") may still return one: it counts as
    # a possible view, never a certain one.
    name = getattr(target, "__name__", None)
    return False if isinstance(name, str) and name in VIEW_OPS else None


def _torch_name(target) -> str | None:
    """The name under which `target` is one of torch's own tensor ops, or None."""
    names = _compat.operator_names(target)
    if names:
        namespace, _, name = names[0].partition("::")
        return name if namespace == "aten" else None
    name = getattr(target, "__name__", None)
    if isinstance(name, str) and (getattr(torch, name, None) is target or getattr(torch.Tensor, name, None) is target):
        return name
    return None


# Python's in-place operators as Dynamo records them (`x += y` is operator.iadd, `x[i] = y` operator.setitem):
# each writes its first argument when that is a tensor.
_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                       operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                       operator.irshift, operator.imatmul, operator.setitem}


def mutated_inputs(gm: fx.GraphModule) -> set[int]:
    """Positions of the piece's inputs that it writes in place (directly or through a view)."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}

    def base_input(node):
        # Any result that may share its argument's storage counts: an in-place op on it may write the base.
        node = storage_base(node)
        return placeholders.get(node) if isinstance(node, fx.Node) else None

    mutated = set()
    for node in gm.graph.nodes:
        mutated.update(i for i in map(base_input, written_arguments(node)) if i is not None)
    return mutated


def written_arguments(node: fx.Node) -> list:
    """The arguments `node` writes in place (by its schema, as Python's in-place operators, or as `x.op_()`)."""
    if node.op not in ("call_function", "call_method"):
        return []
    schemas = _compat.op_schemas(node.target)
    if schemas:   # several for a packet: an argument any of its overloads writes counts
        return [_argument(node, arg, i) for schema in schemas for i, arg in enumerate(schema.arguments)
                if arg.alias_info is not None and arg.alias_info.is_write]
    if node.target in _IN_PLACE_OPERATORS or getattr(operator, _name(node).strip("_"), None) in \
            _IN_PLACE_OPERATORS:   # also `x.__iadd__(y)`
        return list(node.args[:1])
    if _name(node).endswith("_") and not _name(node).startswith("__") and node.args:
        return [node.args[0]]
    return []


def _argument(node: fx.Node, argument: torch.Argument, position: int):
    """The value `node` passes for a schema argument, positionally or by keyword (None when not passed)."""
    if position < len(node.args) and not argument.kwarg_only:
        return node.args[position]
    return node.kwargs.get(argument.name)


def _name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")
