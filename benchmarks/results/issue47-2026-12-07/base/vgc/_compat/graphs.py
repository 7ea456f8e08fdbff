"""Signatures, FX graphs and operators: which keyword a torch function takes in the installed version, splitting,
Dynamo's node metadata and sources, generated code, schemas, tags, custom ops' Python bodies, torch's attention
kernels.

Part of `vgc._compat`: every private torch API vgc uses (see its docstring)."""

from __future__ import annotations

import functools
import inspect
import re
from typing import Callable

import torch
import torch.fx as fx


# ---- Signatures: which keyword a torch function takes in the installed version ------------------------------------

@functools.cache
def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ---- FX graphs: splitting, Dynamo's node metadata, generated code -------------------------------------------------

def split_module(gm: fx.GraphModule, partition: dict[fx.Node, int]) -> fx.GraphModule:
    """`gm` split into one submodule per partition id, in the original node order. Public, but its keywords
    differ between torch versions."""
    from torch.fx.passes.split_module import split_module as _split

    kwargs = {"keep_original_order": True}
    # Uniform tuple outputs (torch >= 2.12) spare the runtime from unwrapping single outputs.
    if _accepts(_split, "tuple_return"):
        kwargs["tuple_return"] = True
    return _split(gm, None, lambda node: partition[node], **kwargs)


def graph_returns_tuple(gm: fx.GraphModule) -> bool:
    """Whether a graph's compiled code returns a sequence of outputs rather than a single value.

    True when the output is a tuple or list, and also when it is one node of a multi-output operator (such a
    graph's single output is already a tuple of tensors). Inductor's own test, private to `compile_fx`.
    """
    from torch._inductor.compile_fx import graph_returns_tuple as _graph_returns_tuple

    return _graph_returns_tuple(gm)


def traced_value(node: fx.Node):
    """The (fake) value Dynamo recorded for a node while tracing, or None (a graph not traced by Dynamo). Dynamo
    keeps it under an undocumented metadata key."""
    return node.meta.get("example_value")


def set_traced_value(node: fx.Node, value) -> None:
    """Record `value` as a node's traced value, for a node vgc adds to a Dynamo graph (see `traced_value`)."""
    node.meta["example_value"] = value


def generated_forward(module: torch.fx.GraphModule) -> Callable:
    """The module's generated `forward`, bound. A lazily recompiled GraphModule's `forward` is a stub that
    regenerates the code and then goes through `Module.__call__` on every call: generate it now instead."""
    real_recompile = getattr(module, "real_recompile", None)   # torch.fx._lazy_graph_module._LazyGraphModule
    if real_recompile is not None:
        real_recompile()
    return module.forward


def placeholder_source_name(node: fx.Node) -> str:
    """Where Dynamo read a graph input from, e.g. "L['self']._modules['lin']._parameters['weight']", or "" when
    unknown. Dynamo keeps it in the placeholder's private `grapharg` metadata; a graph captured ahead of time has
    none, and then the name is recovered from the placeholder's name, which Dynamo derives from the source: exactly
    for the model's weights and buffers (the graph module maps them to their sources), and as `L['<name>']` for
    an argument (a nested one, `L['kv'][0]`, reads `L['kv_0']`)."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is not None:
        return source_name(source)
    if node.op != "placeholder":
        return ""
    state = _state_sources(node.graph.owning_module)
    if node.name in state:
        return state[node.name]
    match = re.fullmatch(r"l_(\w+?)_", node.name)
    return f"L['{match[1]}']" if match else ""


def _placeholder_name(source: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", source).lower()


def _state_sources(gm) -> dict[str, str]:
    """Placeholder name -> source name (`L['self']._modules['lin']._parameters['weight']`) of every weight and
    buffer of a Dynamo graph module, from its private `_param_name_to_source` (keyed `self.lin.weight`)."""
    found = {}
    for fqn in getattr(gm, "_param_name_to_source", None) or {}:
        root, *modules, leaf = fqn.split(".")
        path = f"L['{root}']" + "".join(f"._modules['{m}']" for m in modules)
        for kind in ("_parameters", "_buffers"):
            source = f"{path}.{kind}['{leaf}']"
            found[_placeholder_name(source)] = source
    return found


_STACK_FILE = re.compile(r'File "([^"]+)", line \d+')


def graph_code_files(gm: fx.GraphModule) -> set[str]:
    """Every file named in the user stacks Dynamo recorded on the graph's nodes (private `stack_trace` meta): the
    code that produced an operation, whether or not Python knows it as a module."""
    files = set()
    for node in gm.graph.nodes:
        files.update(_STACK_FILE.findall(node.meta.get("stack_trace") or ""))
    return files


def source_name(source) -> str:
    """A Dynamo `Source`'s name, e.g. "L['input_ids'].size()[0]": a method in some torch versions, a property
    in others."""
    name = source.name
    return str(name() if callable(name) else name)


# ---- Operators: schemas, tags, custom ops' Python bodies, torch's attention kernels -------------------------------

def qualified_name(target: Callable) -> str | None:
    """The dotted name FX gives a callable in generated code ("torch.nn.functional.relu"), or None for one it
    cannot name (a lambda without source, a partial). FX's `_get_qualified_name` is private and raises there."""
    from torch.fx.node import _get_qualified_name

    try:
        return _get_qualified_name(target)
    except Exception:
        return None


def operator_names(target) -> tuple[str, ...]:
    """The names a torch operator answers to: ("ns::op",) for an overload packet, ("ns::op", "ns::op.overload")
    for one overload, () for anything that is not a torch operator. The operator classes live in `torch._ops`."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return (target._qualified_op_name,)
    if isinstance(target, torch._ops.OpOverload):
        base = target._schema.name
        return (base, f"{base}.{target._overloadname}")
    return ()


def custom_op_function(target) -> Callable | None:
    """The Python function behind a `torch.library.custom_op` operator with one implementation for every device,
    to call without the dispatcher: an eager call under no_grad needs none of its autograd, inplace/view and
    device steps, which cost ~100 µs per call on this repository's CPU against ~50 µs for the function. None for
    any other operator, or where torch's private registry of them (`torch._library.custom_ops`) is not there."""
    names = operator_names(target)
    if not names:
        return None
    try:
        from torch._library.custom_ops import _maybe_get_opdef

        opdef = _maybe_get_opdef(names[0])
    except Exception:   # noqa: BLE001 - the private registry moved or changed: use the operator
        return None
    functions = getattr(opdef, "_backend_fns", None)
    if not isinstance(functions, dict) or set(functions) != {None} or not callable(functions[None]):
        return None
    return functions[None]


def op_schema(target) -> torch.FunctionSchema | None:
    """The schema of one operator overload (which arguments it writes, what it returns); None for anything else,
    an overload packet included (its overload is only chosen per call). Read from the private `_schema`."""
    return target._schema if isinstance(target, torch._ops.OpOverload) else None


def op_schemas(target) -> list[torch.FunctionSchema]:
    """`op_schema` for an overload; for an overload packet (Dynamo records `torch.ops.ns.op(...)` calls as the
    packet), the schemas of all its overloads, any of which a call may pick."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return [getattr(target, name)._schema for name in target.overloads()]
    schema = op_schema(target)
    return [] if schema is None else [schema]


def op_tags(target) -> tuple[str, frozenset] | None:
    """(name, tags) of an operator overload, or of an overload packet with the tags of all its overloads (any of
    which a call may pick); None for anything else. The op classes live in the private `torch._ops`."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        overloads = [getattr(target, name) for name in target.overloads()]
        return target._qualified_op_name, frozenset(tag for overload in overloads for tag in overload.tags)
    if isinstance(target, torch._ops.OpOverload):
        return target.name(), frozenset(target.tags)
    return None


def direct_kernel(target) -> Callable | None:
    """The Python body of a `torch.library.custom_op`, when calling it directly equals dispatching to it.

    Dispatching a Python custom op costs tens of microseconds of host time (schema and mutation bookkeeping);
    the eager pieces between CUDA graphs pay it once per layer. Only ops with a single, device-generic kernel
    and no dispatch-level overrides qualify.
    """
    from torch._library import custom_ops

    if isinstance(target, torch._ops.OpOverloadPacket):
        target = getattr(target, "default", None)
    schema = op_schema(target)
    if schema is None:
        return None
    opdef = custom_ops.OPDEFS.get(schema.name)
    if opdef is None or getattr(opdef, "_init_fn", None) is None:
        return None
    overrides = (getattr(opdef, "_torch_dispatch_fns", None), getattr(opdef, "_vmap_fn", None),
                 getattr(opdef, "_autocast_dtype", None), getattr(opdef, "_disabled_kernel", None))
    if set(getattr(opdef, "_backend_fns", {None: None})) != {None} or any(overrides):
        return None
    return opdef._init_fn


def flash_varlen_attention() -> Callable | None:
    """torch's flash varlen attention (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.10), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def flash_varlen_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                         max_seqlen: int, scale: float, causal: bool) -> torch.Tensor:
    """torch's flash-attention varlen forward over sequences that share `cu_seqlens` for queries and keys, with
    grouped K/V heads (private `aten._flash_attention_forward`: the public `varlen_attn` changed its signature
    between 2.10 and 2.12 and takes grouped heads only from 2.12). CUDA, bf16/fp16."""
    return torch.ops.aten._flash_attention_forward(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                   0.0, causal, False, scale=scale)[0]
