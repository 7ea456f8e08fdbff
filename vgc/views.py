"""Which FX nodes return views of their first argument: one table for both readers of it.

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
