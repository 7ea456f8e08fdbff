"""Skinny-matmul fusion: each `vgc::skinny_mm` absorbs the RMSNorm before it (and the residual add before that)
and the SiLU-and-multiply after it, as one `vgc::skinny_mm_fused` or `vgc::skinny_mm_add_fused` (one launch for a
decode step's row, so a layer's Inductor norm and activation kernels disappear).

Before, in a decode piece (the post-grad spelling of a Llama layer's MLP half):

    x = add(o, residual)                                     # read again by the next residual add
    c = convert(x, f32); r = rsqrt(add(mean(pow(c, 2), [-1], True), eps))
    n = mul(convert(mul(c, r), bf16), norm_w)                # RMSNorm(x) * norm_w
    p = vgc.skinny_mm(n, permute(w_gate_up))
    g, u = split(p, I, -1); s = convert(div(convert(g, f32), add(exp(neg(...)), 1)), bf16); y = mul(s, u)

After:

    x, y = vgc.skinny_mm_add_fused(o, residual, permute(w_gate_up), norm_w, eps, True)

Matched by structure, so any model whose graph spells these the same way (transformers' Llama-family RMSNorm and
MLP; `weight * normed` or `normed * weight`; `silu` whole or decomposed; 2-D or flattened 3-D activations) gets it.
A node is absorbed only when the fused op is its only reader; the residual sum, which later nodes read, becomes
the fused op's first output, and only where all of them come after it. Whatever is left unread is removed.
The residual add stays out of the matmul before it: with more rows than the kernel takes, the add and the norm
after it must stay one row kernel, as Inductor fuses them (an add fused into the product would cost cuBLAS a
copy of the residual and leave the norm a kernel of its own).
"""

from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from vgc.ops.skinny_mm import DTYPES

aten = torch.ops.aten
prims = torch.ops.prims
_CONVERT = prims.convert_element_type.default
_RESHAPES = (aten.reshape.default, aten.view.default)


def fuse_skinny_neighbours(graph: fx.Graph) -> int:
    """Fuse around every `vgc::skinny_mm` of `graph`; returns how many became fused ops."""
    graph.eliminate_dead_code()   # a dead reader would hide a pattern (Inductor's graphs have none; traced ones may)
    fused = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.vgc.skinny_mm.default and node.users:
            fused += _fuse(graph, node)
    if fused:
        graph.eliminate_dead_code()
    return fused


def _fuse(graph: fx.Graph, mm: fx.Node) -> int:
    a, b = mm.args
    norm = _rms_norm_input(a, mm)
    if norm is None:
        return 0
    x, norm_weight, eps, flatten, norm_reader = norm
    gated = _silu_mul_of(mm)
    replaced, view = gated or (mm, None)   # the node the fused op's product replaces, and a reshape before it
    shape_args = [*(flatten.args[1:] if flatten is not None else ()), *(view.args[1:] if view is not None else ())]
    added = _residual_sum(x)
    sum_shape = _shape_args(graph, _val(x).shape) if added is not None and flatten is not None else []
    if sum_shape is None:
        added = None   # the sum would need reshaping back to sizes the graph holds no node for
    # The fused op goes right after the last node it reads; it must come before every reader of what it replaces
    # (the product, the sum). A sum that cannot be placed so is left to Inductor, then the whole fusion.
    order = {node: i for i, node in enumerate(graph.nodes)}
    for with_sum in dict.fromkeys((added is not None, False)):
        reads = [*(added.args if with_sum else [x]), b, norm_weight, *shape_args, *(sum_shape if with_sum else ())]
        readers = [*mm.users, *([u for u in added.users if u is not norm_reader] if with_sum else ())]
        where = max(_nodes_in(reads), key=order.__getitem__).next
        if all(order[where] <= order[u] for u in readers):
            break
    else:
        return 0
    added = added if with_sum else None
    with graph.inserting_before(where):
        if added is not None:
            x, residual = added.args
            if flatten is not None:
                residual = _call(graph, flatten.target, (residual, *flatten.args[1:]))
        if flatten is not None:   # the normed activations were [B, T, K]: flatten x the same way
            x = _call(graph, flatten.target, (x, *flatten.args[1:]))
        if added is None:
            out = _call(graph, torch.ops.vgc.skinny_mm_fused.default, (x, b, norm_weight, float(eps), bool(gated)))
        else:
            both = _call(graph, torch.ops.vgc.skinny_mm_add_fused.default,
                         (x, residual, b, norm_weight, float(eps), bool(gated)))
            total, out = (_call(graph, operator.getitem, (both, i)) for i in (0, 1))
            if flatten is not None:
                total = _call(graph, aten.reshape.default, (total, sum_shape))
        if view is not None:   # back to the [B, T, N] the replaced node had
            out = _call(graph, aten.reshape.default, (out, list(view.args[1][:-1]) + [_val(replaced).shape[-1]]))
    replaced.replace_all_uses_with(out)
    if added is not None:
        added.replace_all_uses_with(total, delete_user_cb=lambda user: user is not norm_reader)
    return 1


def _shape_args(graph: fx.Graph, shape) -> list | None:
    """`shape` as a reshape's argument: its ints, and for each symbolic size the graph's node that holds that size
    (a placeholder, or a `sym_size`); None if one has no node."""
    holders = {}
    for node in graph.nodes:
        val = _val(node)
        if isinstance(val, torch.SymInt) and val.node.expr.is_symbol:
            holders.setdefault(val.node.expr, node)
    args = []
    for size in shape:
        if isinstance(size, int):
            args.append(size)
        elif isinstance(size, torch.SymInt) and size.node.expr in holders:
            args.append(holders[size.node.expr])
        else:
            return None
    return args


def _nodes_in(values) -> list[fx.Node]:
    found = []
    for value in values:
        if isinstance(value, fx.Node):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += _nodes_in(value)
    return found


def _residual_sum(x: fx.Node):
    """The add node `x` is, when it sums two tensors of its shape and dtype."""
    if not _is(x, aten.add.Tensor) or x.kwargs or len(x.args) != 2:
        return None
    val = _val(x)
    for operand in x.args:
        o_val = _val(operand)
        if not isinstance(o_val, torch.Tensor) or o_val.dtype != val.dtype or tuple(o_val.shape) != tuple(val.shape):
            return None
    return x


# ---- matchers: each returns None unless the whole pattern is there and its result has no other reader ----

def _is(node, *targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _arg(node: fx.Node, index: int, default):
    """The node's positional argument `index`, or `default` where the call left it out."""
    return node.args[index] if len(node.args) > index else default


def _items(node: fx.Node) -> dict[int, fx.Node]:
    """The `getitem` readers of a node that returns several tensors (a split, a fused op's sum and product), by
    index."""
    return {u.args[1]: u for u in node.users if u.target is operator.getitem}


def _only_user(node: fx.Node, user: fx.Node) -> bool:
    return len(node.users) == 1 and user in node.users


def _to_float32(node):
    """x for `convert(x, f32)` of a bf16/fp16 x, else None."""
    if _is(node, _CONVERT) and node.args[1] == torch.float32 and getattr(_val(node.args[0]), "dtype", None) in DTYPES:
        return node.args[0]
    return None


def _last_dim(dims, ndim) -> bool:
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] in (-1, ndim - 1)


def _rms_norm_input(a, mm: fx.Node):
    """(x, norm weight, eps, the reshape between or None, the norm's reader of x) when the matmul's input is
    `RMSNorm(x) * weight`."""
    flatten = None
    if _is(a, *_RESHAPES) and _only_user(a, mm) and len(_val(a.args[0]).shape) > 2:
        flatten, a = a, a.args[0]
    if not _is(a, aten.mul.Tensor) or len(a.users) != 1:
        return None
    for normed, weight in (a.args, a.args[::-1]):
        if not _is(normed, _CONVERT) or normed.args[1] not in DTYPES:
            continue
        w_val = _val(weight)
        if not isinstance(w_val, torch.Tensor) or w_val.dim() != 1 or w_val.dtype != normed.args[1]:
            continue
        inner = normed.args[0]
        if not _is(inner, aten.mul.Tensor):
            continue
        for c, rstd in (inner.args, inner.args[::-1]):
            x = _to_float32(c)
            eps = _rstd_eps(rstd, c)
            if x is not None and eps is not None and _val(x).dtype == normed.args[1] and \
                    _val(x).shape[-1] == w_val.shape[0]:
                return x, weight, eps, flatten, c
    return None


def _rstd_eps(rstd, c):
    """eps when `rstd` is `rsqrt(mean(c * c over the last dim, keepdim) + eps)`."""
    if not _is(rstd, aten.rsqrt.default) or not _is(rstd.args[0], aten.add.Tensor):
        return None
    mean, eps = rstd.args[0].args
    if isinstance(mean, (int, float)):
        mean, eps = eps, mean
    if not isinstance(eps, (int, float)) or not _is(mean, aten.mean.dim) or rstd.args[0].kwargs:
        return None
    square, dims, keepdim = mean.args[0], _arg(mean, 1, None), _arg(mean, 2, False)
    if not (keepdim or mean.kwargs.get("keepdim")) or not _last_dim(dims, _val(c).dim()):
        return None
    if _is(square, aten.pow.Tensor_Scalar) and square.args == (c, 2):
        return eps
    if _is(square, aten.mul.Tensor) and square.args == (c, c):
        return eps
    return None


def _output_view(mm: fx.Node):
    """(the matmul's output as its readers see it, the [B, T, N] reshape between or None)."""
    users = list(mm.users)
    if len(users) == 1 and _is(users[0], *_RESHAPES):
        return users[0], users[0]
    return mm, None


def _halves(y: fx.Node, columns):
    """(gate, up) when every reader of `y` takes its first or its second half of `columns` on the last dim."""
    half = columns // 2
    parts = _column_parts(y, columns)
    if parts is None or set(parts) != {0, half} or parts[0][0] != half or parts[half][0] != columns:
        return None
    return parts[0][1], parts[half][1]


def _column_parts(y: fx.Node, columns) -> dict | None:
    """{first column: (end column, reader)} when every reader of `y` takes one range of its last dim (`columns`
    wide): the items of one split, or slices; else None."""
    users = list(y.users)
    last = _val(y).dim() - 1
    if len(users) == 1 and _is(users[0], aten.split.Tensor, aten.split_with_sizes.default):
        split = users[0]
        sizes, dim = split.args[1], _arg(split, 2, 0)
        if isinstance(sizes, int):
            sizes = [sizes] * -(-columns // sizes) if sizes > 0 else []
        if dim not in (-1, last) or not all(isinstance(size, int) for size in sizes) or sum(sizes) != columns:
            return None
        items = _items(split)
        if len(items) != len(split.users):
            return None
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return {starts[i]: (starts[i] + sizes[i], item) for i, item in items.items()}
    found = {}
    for user in users:
        span = _slice_span(user, last, columns)
        if span is None or span[0] in found:
            return None
        found[span[0]] = (span[1], user)
    return found


def _slice_span(node, last: int, size: int):
    """(start, end) when `node` takes a contiguous range of its input's last dim (`size` long) with constant
    bounds, else None."""
    if not _is(node, aten.slice.Tensor) or _arg(node, 1, 0) not in (-1, last) or _arg(node, 4, 1) != 1:
        return None
    start, end = _arg(node, 2, None), _arg(node, 3, None)
    start, end = 0 if start is None else start, size if end is None else end
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    end = min(end, size)
    return (start, end) if 0 <= start < end else None


def _silu_of(node):
    """g when `node` is silu(g) rounded back to g's dtype: aten.silu, or its decompositions."""
    if _is(node, aten.silu.default):
        return node.args[0]
    if not _is(node, _CONVERT) or node.args[1] not in DTYPES:
        return None
    inner = node.args[0]
    if _is(inner, aten.div.Tensor):
        c, denominator = inner.args
        if _is(denominator, aten.add.Tensor) and 1 in denominator.args:
            exp = denominator.args[0] if denominator.args[1] == 1 else denominator.args[1]
            if _is(exp, aten.exp.default) and _is(exp.args[0], aten.neg.default) and exp.args[0].args[0] is c:
                return _to_float32(c)
    if _is(inner, aten.mul.Tensor):
        for c, sig in (inner.args, inner.args[::-1]):
            if _is(sig, aten.sigmoid.default) and sig.args[0] is c:
                return _to_float32(c)
    return None


def _silu_mul_of(mm: fx.Node):
    """(the product, the reshape or None) for `silu(p[..., :n]) * p[..., n:]` of the matmul's output p."""
    y, view = _output_view(mm)
    columns = _val(mm).shape[1]
    if not isinstance(columns, int) or columns % 2:
        return None
    halves = _halves(y, columns)
    if halves is None:
        return None
    gate, up = halves
    if len(gate.users) != 1 or len(up.users) != 1:
        return None
    product = next(iter(up.users))
    if not _is(product, aten.mul.Tensor) or len(product.args) != 2 or up not in product.args:
        return None
    silu = product.args[0] if product.args[1] is up else product.args[1]
    if _silu_of(silu) is not gate or _val(silu).dtype != _val(mm).dtype:
        return None
    # The silu chain may only feed the product (its intermediate nodes die with it).
    if len(silu.users) != 1:
        return None
    return product, view


_FUSED = (torch.ops.vgc.skinny_mm_fused.default, torch.ops.vgc.skinny_mm_add_fused.default)


def fuse_rotary(graph: fx.Graph) -> int:
    """Fuse the rotary embedding of q and k into the fused matmul that makes them (after `fuse_skinny_neighbours`):
    each ungated `vgc::skinny_mm_fused` / `vgc::skinny_mm_add_fused` whose product's first columns are q and k,
    rotated as `_rope_of` matches, takes `cos`, `sin` (one row per product row) and the rotated columns, and the
    readers of the rotation read the product instead. Returns how many."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _FUSED:
            continue
        add = node.target is torch.ops.vgc.skinny_mm_add_fused.default
        if len(node.args) > (6 if add else 5) or node.args[5 if add else 4]:   # rotated already, or gated
            continue
        product = node
        if add:
            product = _items(node).get(1)
            if product is None:
                continue
        rope = _rope_of(product)
        if rope is None or any(order[table] > order[node] for table in rope[:2]):
            continue   # the tables are made after the matmul: leave the rotation to Inductor
        cos, sin, columns, head_dim, rotations = rope
        with graph.inserting_before(node):   # one row of the tables per row of the product
            cos, sin = (t if _val(t).dim() == 2 else _call(graph, aten.reshape.default, (t, [-1, _val(t).shape[-1]]))
                        for t in (cos, sin))
        node.args = (*node.args, cos, sin, columns, head_dim)
        for rotated, heads in rotations:
            rotated.replace_all_uses_with(heads)   # the heads now read the product the kernel rotated
        fused += 1
    if fused:
        graph.eliminate_dead_code()
    return fused


def _rope_of(mm: fx.Node):
    """(cos, sin, rotated columns, head dim, [(each rotated head tensor, the heads it rotates)]) when the product's
    first columns are q and k, read only as heads that get the NeoX rotary embedding by the same tables, in either
    spelling (`_neox_rotation`: vgc's Llama; `_half_turn_rotation`: transformers'), and its other readers take
    later columns."""
    y, _ = _output_view(mm)
    columns = _val(y).shape[-1]
    parts = _column_parts(y, columns) if isinstance(columns, int) else None
    if not parts or 0 not in parts or parts[0][0] not in parts:
        return None
    q_end = parts[0][0]
    rotated_columns = parts[q_end][0]
    if any(start < rotated_columns for start in parts if start not in (0, q_end)):
        return None
    found, tables = [], None
    for start in (0, q_end):
        part = parts[start][1]
        if len(part.users) != 1 or not _is(next(iter(part.users)), *_RESHAPES):
            return None
        heads = next(iter(part.users))
        shape = _val(heads).shape
        head_dim = shape[-1]
        if len(shape) < 3 or not isinstance(head_dim, int) or head_dim % 2:
            return None
        match = _neox_rotation(heads, head_dim) or _half_turn_rotation(heads, head_dim)
        if match is None or (tables is not None and match[2:] != tables) or \
                not all(_table(t, shape) for t in match[2:]):
            return None
        tables = match[2:]
        found.append(match[:2])
    if _val(found[0][1]).shape[-1] != _val(found[1][1]).shape[-1]:
        return None
    return (*tables, rotated_columns, _val(found[0][1]).shape[-1], found)


def _table(node, heads_shape) -> bool:
    """A cos or sin table for heads of `heads_shape` ([..., H, D]): one row per token ([..., D / 2] or
    [..., D])."""
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dim() != len(heads_shape) - 1:
        return False
    return val.shape[-1] in (heads_shape[-1] // 2, heads_shape[-1]) and \
        all(statically_known_true(a == b) for a, b in zip(val.shape[:-1], heads_shape[:-2]))


def _neox_rotation(heads: fx.Node, head_dim: int):
    """(the rotated tensor, heads, cos, sin) for vgc's Llama spelling of the rotation of `heads` ([T, H, D]) by
    `cos`/`sin` ([T, D/2], unsqueezed over the heads): `cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)` of its
    halves, in fp32, rounded back."""
    c = next(iter(heads.users))
    if len(heads.users) != 1 or _to_float32(c) is not heads or len(c.users) != 1:
        return None
    split = next(iter(c.users))
    if not _is(split, aten.split.Tensor) or split.args[1] != head_dim // 2 or _arg(split, 2, 0) not in (-1, 2):
        return None
    halves = _items(split)
    if set(halves) != {0, 1}:
        return None
    x1, x2 = halves[0], halves[1]

    def product(node, left):   # (the other factor's source) when node is left * unsqueeze(source, 1)
        if not _is(node, aten.mul.Tensor) or left not in node.args:
            return None
        other = node.args[1] if node.args[0] is left else node.args[0]
        if _is(other, aten.unsqueeze.default) and other.args[1] == 1:
            return other.args[0]
        return None

    cats = {u for half in (x1, x2) for mul in half.users for op in mul.users for u in op.users}
    if len(cats) != 1:
        return None
    cat = cats.pop()
    if not _is(cat, aten.cat.default) or len(cat.args[0]) != 2 or _arg(cat, 1, 0) not in (-1, 2):
        return None
    minus, plus = cat.args[0]
    if not _is(minus, aten.sub.Tensor) or not _is(plus, aten.add.Tensor):
        return None
    cos, sin = product(minus.args[0], x1), product(minus.args[1], x2)
    if cos is None or sin is None or product(plus.args[0], x2) is not cos or product(plus.args[1], x1) is not sin:
        return None
    out = next(iter(cat.users)) if len(cat.users) == 1 else None
    if not _is(out, _CONVERT) or out.args[1] != _val(heads).dtype:
        return None
    return out, heads, cos, sin


def _half_turn_rotation(heads: fx.Node, head_dim: int):
    """(the rotated tensor, the tensor it rotates, cos, sin) for transformers' spelling of the rotation of `heads`
    ([B, T, H, D], or its [B, H, T, D] transpose) by `cos`/`sin` ([B, T, D], unsqueezed over the heads):
    `x * cos + cat(-x2, x1) * sin`, each column by its own value of the tables."""
    x, heads_dim = heads, _val(heads).dim() - 2
    if len(heads.users) == 1 and _is(next(iter(heads.users)), aten.permute.default):
        x = next(iter(heads.users))
        if list(x.args[1]) != [*range(heads_dim - 1), heads_dim, heads_dim - 1, heads_dim + 1]:
            return None   # only the heads swapped with the tokens before them
        heads_dim -= 1
    half = head_dim // 2
    last = _val(x).dim() - 1
    slices = {_slice_span(user, last, head_dim): user for user in x.users}
    x1, x2 = slices.get((0, half)), slices.get((half, head_dim))
    if len(x.users) != 3 or x1 is None or x2 is None or len(x2.users) != 1 or len(x1.users) != 1:
        return None
    neg, cat = next(iter(x2.users)), next(iter(x1.users))
    if not _is(neg, aten.neg.default) or len(neg.users) != 1 or next(iter(neg.users)) is not cat or \
            not _is(cat, aten.cat.default) or cat.args[0] != [neg, x1] or _arg(cat, 1, 0) not in (-1, last):
        return None
    (straight,) = set(x.users) - {x1, x2}
    if len(cat.users) != 1 or len(straight.users) != 1:
        return None
    turned = next(iter(cat.users))
    out = next(iter(straight.users))
    if not _is(out, aten.add.Tensor) or set(out.args) != {straight, turned} or out.kwargs or \
            _val(out).dtype != _val(x).dtype or tuple(_val(out).shape) != tuple(_val(x).shape):
        return None

    def table(mul, operand):   # the table of `mul` = operand * unsqueeze(table, heads_dim)
        if not _is(mul, aten.mul.Tensor) or len(mul.args) != 2 or operand not in mul.args:
            return None
        other = mul.args[1] if mul.args[0] is operand else mul.args[0]
        if _is(other, aten.unsqueeze.default) and other.args[1] in (heads_dim, heads_dim - last - 1):
            return other.args[0]
        return None

    cos, sin = table(straight, x), table(turned, cat)
    if cos is None or sin is None:
        return None
    return out, x, cos, sin


def _call(graph: fx.Graph, target, args) -> fx.Node:
    """A new node with its `val` computed as Inductor's own passes do: the target run on the fake values."""
    node = graph.call_function(target, tuple(args))
    fake_args = [_val(a) if isinstance(a, fx.Node) else a for a in args]
    fake_args = [[_val(x) if isinstance(x, fx.Node) else x for x in a] if isinstance(a, list) else a
                 for a in fake_args]
    mode = next((v.fake_mode for v in fake_args if hasattr(v, "fake_mode")), None)
    with mode or contextlib.nullcontext():
        node.meta["val"] = target(*fake_args)
    return node
