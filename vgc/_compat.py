"""Every private torch API vgc uses lives here, and nothing else.

"Private" means anything under a `torch._*` module, a `_`-prefixed name, an undocumented attribute (a SymInt's
`.node`, a ShapeEnv's guards, Dynamo's node metadata), or a public API whose spelling differs between the torch
versions vgc supports (2.11 to 2.15). Torch may move any of these in a release; keeping them in one module makes
that release one file to adapt, and lets the rest of vgc read as plain public torch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import re
import sys
import tempfile
import types
from typing import Any, Callable

import sympy
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


# ---- Symbolic sizes: the shape environment's symbols, sources and guards ------------------------------------------

def symbolic_expr(value: torch.SymInt) -> sympy.Expr:
    """The sympy expression behind a SymInt, in the ShapeEnv's canonical symbols: sizes Dynamo proved equal are
    one symbol. Read from the SymInt's node, which is no public API; newer torch applies the replacements when
    reading `.expr`, older torch does not, and applying them twice changes nothing."""
    node = value.node
    shape_env = getattr(node, "shape_env", None)
    expr = node.expr
    return shape_env.replace(expr) if shape_env is not None else expr


def _shape_env(fake_mode):
    return getattr(fake_mode, "shape_env", None) if fake_mode is not None else None


def symbol_sources(fake_mode) -> dict[sympy.Symbol, str]:
    """Each size symbol's first source, by name ("L['x'].size()[0]"), from the fake mode's ShapeEnv (whose
    `var_to_sources` is undocumented); {} without a ShapeEnv."""
    shape_env = _shape_env(fake_mode)
    if shape_env is None:
        return {}
    return {symbol: source_name(sources[0]) for symbol, sources in shape_env.var_to_sources.items() if sources}


# "if x.shape[0] > 4:  # model.py:7 in forward (_dynamo/variables/tensor.py:2606 in evaluate_expr)": the user's
# line, then the torch frame that made the guard, which says nothing to a user.
_TORCH_FRAME = re.compile(r"\s*\([^()]*\.py:\d+ in [^()]*\)$")


def shape_guards(fake_mode) -> list[tuple[sympy.Basic, str]]:
    """The shape guards recorded so far in the fake mode's ShapeEnv, in order: (expression, the user code that
    made torch guard, or ""). A ShapeEnv's guard list and their source locations are undocumented."""
    shape_env = _shape_env(fake_mode)
    if shape_env is None:
        return []
    return [(guard.expr, _user_line(str(getattr(guard, "sloc", "") or ""))) for guard in shape_env.guards]


def _user_line(where: str) -> str:
    """torch's location of a guard as the user's line only, its file named in full."""
    return _USER_FILE.sub(_full_user_file, _TORCH_FRAME.sub("", where.strip()))


# torch names the user's file relative to the directory it shares with torch's own (`shorten_filename`); where
# that is only "/", it cuts the first character of the path's first name too ("/tmp/m.py" becomes "mp/m.py").
_USER_FILE = re.compile(r"(?<=# )(\S+\.py)(?=:\d+ in )")


def _full_user_file(match: re.Match) -> str:
    """The loaded source file that torch's shortened name stands for (unique), else the name as torch gave it."""
    short = match.group(1)
    if os.path.isabs(short):
        return short
    loaded = {getattr(module, "__file__", None) for module in list(sys.modules.values())} | set(linecache.cache)
    found = {path for path in loaded if isinstance(path, str) and path.endswith(short) and
             (path[:-len(short)].endswith(os.sep) or len(path) - len(short) == 2)}
    return found.pop() if len(found) == 1 else short


def size_hint(value) -> int | None:
    """A size's value in the trace, read without adding a guard; None for a size the trace has no value for
    (unbacked)."""
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return None if hint is None else int(hint)
    return int(value)


def python_text(expr) -> str | None:
    """A sympy expression of torch's shape functions (FloorDiv, PythonMod, ...) as Python source, by torch's own
    printer (private); None where it cannot print it."""
    try:
        from torch.utils._sympy.printers import PythonPrinter

        return PythonPrinter().doprint(expr)
    except Exception:   # noqa: BLE001 - an older or newer torch: the caller falls back to sympy's own text
        return None


# ---- Fake tensors -------------------------------------------------------------------------------------------------

def detect_fake_mode(inputs: list):
    """The FakeTensorMode Dynamo traced `inputs` under, or None outside Dynamo (private `torch._guards`)."""
    return torch._guards.detect_fake_mode(inputs)


def is_fake(tensor: torch.Tensor) -> bool:
    """A fake tensor (shapes only, no data), as Dynamo and Inductor trace with (private `torch._subclasses`)."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(tensor)


@contextlib.contextmanager
def fake_propagation(fake_mode):
    """Run ops on `fake_mode`'s tensors as Dynamo propagates them: through the Python dispatcher (private
    `torch._dispatch.python`), so composite ops decompose in Python on symbolic sizes, and adding no guard to
    Dynamo's shape environment (private `ShapeEnv.suppress_guards`). For re-running a traced graph only to learn
    its pieces' input shapes. Without the Python dispatcher, torch 2.11's C++ matmul on CUDA asks for concrete
    sizes and pins the token count of transformers' rotary embedding; the trace already holds every guard it
    needs."""
    from torch._dispatch.python import enable_python_dispatcher

    shape_env = getattr(fake_mode, "shape_env", None)
    with fake_mode, enable_python_dispatcher(), \
            (shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()):
        yield


def fake_inputs(fake_mode, inputs: list) -> list:
    """`inputs` with every tensor replaced by a fake tensor of `fake_mode` (sizes stay symbolic; a fake of another
    mode is re-made in this one)."""
    return [x if isinstance(x, torch.Tensor) and getattr(x, "fake_mode", None) is fake_mode
            else fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]


# ---- Inductor: standalone compile, artifacts, configuration, custom passes, its in-memory caches ------------------

def standalone_compile(gm: fx.GraphModule, example_inputs: list, *, dynamic_shapes: str,
                       config_patches: dict[str, Any]):
    """One Inductor compile of `gm`, as a saveable CompiledArtifact; `torch._inductor` is private."""
    from torch._inductor import standalone_compile as _standalone_compile

    kwargs: dict[str, Any] = {"dynamic_shapes": dynamic_shapes, "options": {"config_patches": dict(config_patches)}}
    return _standalone_compile(gm, example_inputs, **kwargs)


def load_artifact(path: str, fmt: str):
    """A CompiledArtifact saved by `standalone_compile`'s result, loaded (private `torch._inductor`)."""
    from torch._inductor import CompiledArtifact

    return CompiledArtifact.load(path=path, format=fmt)


def save_artifact(artifact, path: str, fmt: str) -> None:
    """Save what `standalone_compile` returned (a private `torch._inductor` CompiledArtifact)."""
    artifact.save(path=path, format=fmt)


@functools.cache
def inductor_option_names() -> frozenset[str]:
    """Every Inductor config option's name, for validating user options. `torch._inductor.config` is private; its
    names are fixed once torch is imported, so they are read once."""
    import torch._inductor.config as inductor_config

    return frozenset(inductor_config.get_config_copy())


def inductor_config_portable() -> dict[str, Any]:
    """Inductor's current config, without process-specific entries, for cache keys (private config module)."""
    import torch._inductor.config as inductor_config

    return inductor_config.save_config_portable()


def clear_inductor_memory_caches() -> None:
    """Drop Inductor's in-memory caches of loaded modules and kernel paths, after files under its cache directory
    were removed or the directory moved (private `torch._inductor.utils`)."""
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:
        return
    clear_caches()


def inductor_code_name(source: str) -> str | None:
    """The name Inductor gives the file of a generated module (`PyCodeCache.write`: a hash of the stripped source,
    no extra key), or None where this torch has no such function (`torch._inductor.codecache.code_hash`)."""
    try:
        from torch._inductor.codecache import code_hash
    except ImportError:
        return None
    return code_hash(source.strip())


_CUSTOM_PASS_OPTIONS = ("pre_grad_custom_pass", "joint_custom_pre_pass", "joint_custom_post_pass",
                        "post_grad_custom_pre_pass", "post_grad_custom_post_pass", "_pre_fusion_custom_pass",
                        "_post_fusion_custom_pass")


def inductor_custom_passes() -> dict[str, Any]:
    """The user passes set in Inductor's global config (left out of `save_config_portable`, but they change the
    generated code): option name -> the pass object, for those set (private config module)."""
    import torch._inductor.config as inductor_config

    found = {}
    for name in _CUSTOM_PASS_OPTIONS:
        value = getattr(inductor_config, name, None)
        if value is not None and value != []:
            found[name] = value
    return found


def _custom_graph_pass_base() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass as base  # private module

    return base


# The base class of Inductor's custom graph passes: a pass in `post_grad_custom_post_pass` must be one (with a
# `uuid()`) for Inductor to cache what it compiles.
CustomGraphPass = _custom_graph_pass_base()


def functorch_config_portable() -> dict[str, Any]:
    """AOTAutograd's current config, without process-specific entries, for cache keys (private config module)."""
    import torch._functorch.config as functorch_config

    return functorch_config.save_config_portable()


def torch_build_key() -> str:
    """A hash of the installed torch build, as Inductor's own cache keys it (private `codecache`)."""
    return torch_source_key().hex()[:32]


def torch_source_key(known: bytes | None = None) -> bytes:
    """Inductor's hash of torch's source files (private `codecache.torch_key`: it reads every torch module, 0.1-0.7
    s). `known`, the value an earlier process computed for these same files, is handed to Inductor instead, where
    torch allows it and has not computed its own yet (its cache has a `set`)."""
    from torch._inductor.codecache import torch_key

    if known is not None:
        try:
            torch_key.set(known)
        except (AttributeError, AssertionError, RuntimeError):   # no setter, or already known in this process
            pass
    return torch_key()


def cpu_vec_isa() -> str:
    """The CPU vector ISA Inductor generates C++ for on this machine, e.g. "avx512" (private `cpu_vec_isa`).

    Inductor finds it by building and loading test libraries in its cache directory, under a file lock there; a
    root that is read-only or full fails that. The answer does not depend on where they are built, so the check
    then runs in a private temporary directory."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    try:
        return str(pick_vec_isa())
    except OSError as error:
        import logging

        logging.getLogger("vgc").warning(
            "Inductor's CPU check cannot write under %s (%s); it runs in a temporary directory instead",
            os.environ.get("TORCHINDUCTOR_CACHE_DIR", "Inductor's cache directory"), error.strerror or error)
        with tempfile.TemporaryDirectory(prefix="vgc-cpu-isa-") as private:
            saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = private
            try:
                return str(pick_vec_isa())
            finally:
                if saved is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def wrap_cpu_isa_probe(wrap: Callable[[Callable], Callable]) -> bool:
    """Replace Inductor's CPU vector-ISA load probe (`VecISA._probe_load(self, output_path) -> bool`: a
    subprocess that `dlopen`s a test library, torch >= 2.13) by `wrap(probe)`; False where torch has no such
    probe (before 2.13: `wrap_cpu_isa_check`) and nothing was replaced."""
    from torch._inductor.cpu_vec_isa import VecISA

    probe = getattr(VecISA, "_probe_load", None)
    if probe is None:
        return False
    VecISA._probe_load = wrap(probe)
    return True


def wrap_cpu_isa_check(wrap: Callable[[Callable], Callable]) -> bool:
    """Replace Inductor's whole CPU vector-ISA check (`VecISA.check_build(self, code) -> bool`, torch < 2.13: it
    builds a test library if needed, then loads it in a child Python that imports torch, about 3 s per ISA on a
    2-core machine) by `wrap(check)`; False where torch has the separate load probe (`wrap_cpu_isa_probe`)."""
    from torch._inductor.cpu_vec_isa import VecISA

    check = getattr(VecISA, "check_build", None)
    if check is None or hasattr(VecISA, "_probe_load"):
        return False
    VecISA.check_build = wrap(check)
    return True


def inductor_cpp_compiler() -> str:
    """Inductor's configured C++ compiler (`config.cpp.cxx`, private config module) and the binary its first
    name resolves to (path, size, modification time), for records of what it built: a compiler upgraded or
    replaced under the same name is another compiler."""
    import shutil

    import torch._inductor.config as inductor_config

    configured = inductor_config.cpp.cxx
    names = [name for name in (configured if isinstance(configured, (list, tuple)) else (configured,)) if name]
    binary = next(filter(None, map(shutil.which, names)), None)
    if binary is None:
        return repr((configured, None))
    binary = os.path.realpath(binary)
    try:
        status = os.stat(binary)
    except OSError:
        return repr((configured, binary))
    return repr((configured, binary, status.st_size, status.st_mtime_ns))


def inductor_cache_dir() -> str:
    """The directory Inductor keeps its compiled kernels in now (private `cache_dir_utils`)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


# ---- Dynamo: dynamic dims, guards, compile ids, errors, recompile limits, tracing context -------------------------

def device_from_inputs(example_inputs) -> torch.device:
    """The device of a graph's first input that has one, else CPU (a graph of only Python numbers): Dynamo's rule
    for backends (`torch._dynamo.backends.common.device_from_inputs`), written out rather than imported from a
    private module that pulls in AOTAutograd."""
    return next((x.device for x in example_inputs if hasattr(x, "device")), torch.device("cpu"))


def traced_code_objects() -> list:
    """Code objects Dynamo inlined while tracing the current graph (read inside a backend)."""
    context = torch._guards.TracingContext.try_get()
    return list(getattr(context, "traced_code", None) or []) if context is not None else []


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Make Dynamo trace `dim` of `tensor` as a backed symbolic size; documented, but under `torch._dynamo`."""
    torch._dynamo.mark_dynamic(tensor, dim)


def maybe_mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Like `mark_dynamic`, but a trace that needs one value of the size specialises it (a guard `size == n`)
    instead of failing."""
    torch._dynamo.maybe_mark_dynamic(tensor, dim)


def mark_unbacked(tensor: torch.Tensor, dim: int, shape_id: str | None = None) -> None:
    """Make Dynamo trace `dim` of `tensor` as an unbacked size; dims with one `shape_id` share a symbol where
    torch accepts `shape_id` (newer versions only)."""
    from torch._dynamo.decorators import mark_unbacked as _mark_unbacked

    kwargs = {}
    if shape_id is not None and _accepts(_mark_unbacked, "shape_id"):
        kwargs["shape_id"] = shape_id
    _mark_unbacked(tensor, dim, **kwargs)


def assume_equal(a, b) -> None:
    """Tell the tracer two sizes are equal (a replacement for backed sizes, a runtime check for unbacked ones)."""
    torch._check(a == b)


def backed_size_oblivious(enabled: bool):
    """A context in which backed sizes are traced size-obliviously (no 0/1 specialisation); private config."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


def no_duck_shape():
    """A context in which equal sizes get distinct symbols unless the code relates them; private config."""
    return torch.fx.experimental._config.patch(use_duck_shape=False)


def skip_all_guards(guard_entries) -> list[bool]:
    """A `guard_filter_fn` that drops every guard Dynamo can drop: public, but only in newer torch versions;
    older ones keep every guard."""
    fn = getattr(torch.compiler, "skip_all_guards_unsafe", None)
    if fn is not None:
        return fn(guard_entries)
    return [False for _ in guard_entries]


def register_bytecode_hook(hook):
    """Call `hook(code, new_code)` with Dynamo's transformed bytecode of every frame it compiles; returns a
    removable handle. Private `convert_frame`."""
    return torch._dynamo.convert_frame.register_bytecode_hook(hook)


def dynamo_compile_id() -> str | None:
    """The id of the Dynamo compile in progress ("frame/recompile", e.g. "0/1"), or None outside one; the id
    torch's own logs use. Read from the private `torch._guards.CompileContext`."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    return None if compile_id is None else str(compile_id)


@functools.cache
def _passthrough_type(cls: type) -> type:
    from torch._dynamo.exc import ShortenTraceback

    def __init__(self, *args):
        ShortenTraceback.__init__(self, *args, first_useful_frame=None)

    return type(cls.__name__, (cls, ShortenTraceback), {"__init__": __init__, "__module__": cls.__module__})


def through_dynamo(exc: Exception) -> Exception:
    """An exception of the same type (a subclass) that Dynamo re-raises unwrapped from a backend.

    Dynamo wraps backend errors in BackendCompilerFailed; users should see vgc's own ValueError or
    CompileAfterWarmupError, which `except`/`pytest.raises` on that type then catch.
    """
    new = _passthrough_type(type(exc))(*exc.args)
    new.__cause__ = exc.__cause__
    return new


def untraceable_errors() -> tuple[type[Exception], ...]:
    """What Dynamo raises for code it cannot trace, and the symbolic-shapes error for a guard on a data-dependent
    size (private modules; stable names since torch 2.1)."""
    from torch._dynamo.exc import Unsupported
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return Unsupported, GuardOnDataDependentSymNode


def forget_size_history() -> None:
    """Forget which sizes Dynamo has seen change, per code object (its automatic-dynamic state, private
    `torch._dynamo.pgo`), without dropping compiled code: a benchmark that compiles one model class under several
    strategies in one process would otherwise trace each strategy with the dims an earlier one saw vary."""
    try:
        from torch._dynamo import pgo
    except ImportError:   # a torch without it keeps this state per compiled function
        return
    reset = getattr(pgo, "reset_code_state", None)
    if reset is not None:
        reset()


def allow_recompiles(limit: int) -> None:
    """Let Dynamo keep at least `limit` compiled versions of one frame (private `torch._dynamo.config`): a
    benchmark compiles one model's forward under several strategies."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def source_name(source) -> str:
    """A Dynamo `Source`'s name, e.g. "L['input_ids'].size()[0]": a method in some torch versions, a property
    in others."""
    name = source.name
    return str(name() if callable(name) else name)


def tracing_context():
    """The TracingContext a backend runs in, to compile inside it later (`within_tracing_context`)."""
    return torch._guards.TracingContext.try_get()


def within_tracing_context(context):
    return torch._guards.tracing(context) if context is not None else contextlib.nullcontext()


_GUARD_ROOT = re.compile(r"[A-Za-z_]\w*")
# A function's default values are its code's constants: the entry's source hash pins them. Guards that reach them
# through closures may also name objects a library builds lazily (transformers 5.25 with `kernels` installed wraps
# functions per module at first call), so a fresh process cannot even evaluate them before its first call.
_FUNCTION_DEFAULTS = re.compile(r"\.__(kw)?defaults__\b")


def model_state_guard_filter(argument_names: set[str], take_over: Callable[[Any], bool] | None = None) -> Callable:
    """A `guard_filter_fn` for a saved program: keep the serializable guards on the model's own state (its
    attributes' values, hooks, global torch state) and on globals the trace read (a module constant), and drop
    those on the call's arguments (vgc's input contract checks them) and on sizes. Types and the functions a
    model holds are checked by vgc itself (`guards.ModelStructure`), and so is any guard `take_over(entry)` says
    vgc records and checks itself (an entry has `name`, `guard_type`, `has_value`, `value`, `is_global`)."""
    from torch._dynamo.guards import CheckFunctionManager

    # Identity guards name objects of this process (a module, a function, a local class): they cannot be saved.
    # Type and attribute-lookup guards are left out too: the source hash of the entry already pins the classes'
    # code, and rebuilding a hundred type guards costs a warm start about a second. Weights' dtypes and shapes are
    # checked by vgc (`guards.state_mismatch`), in a millisecond instead of Dynamo's tensor guards' 0.4 s.
    unsupported = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ())) | {
        "SHAPE_ENV", "TYPE_MATCH", "NOT_PRESENT_IN_GENERIC_DICT", "DICT_NOT_CONTAINS", "TENSOR_MATCH"}

    def keep(entries) -> list[bool]:
        kept = []
        for entry in entries:
            root = _GUARD_ROOT.match(entry.name)
            types = {entry.guard_type, *getattr(entry, "derived_guard_types", ())}
            kept.append(not types & unsupported and not getattr(entry.orig_guard, "_unserializable", False)
                        and not _FUNCTION_DEFAULTS.search(entry.name)
                        and (entry.is_global or root is None or root[0] not in argument_names)
                        and not (take_over is not None and take_over(entry)))
        return kept
    return keep


def has_module_hooks(model) -> bool:
    """Forward hooks on `model` or any of its submodules, or global ones: a saved trace must not serve such a
    model (a hook added after the save would be skipped; one on the top module is outside `forward`)."""
    modules = torch.nn.modules.module
    if not isinstance(model, torch.nn.Module):
        return False
    return bool(modules._global_forward_hooks or modules._global_forward_pre_hooks) or any(
        m._forward_hooks or m._forward_pre_hooks for m in model.modules())


# ---- Dynamo AOT precompile (a saved trace) ------------------------------------------------------------------------

def _serializable_callable_base() -> type | None:
    try:
        from torch._dynamo.aot_compile_types import SerializableCallable
    except ImportError:
        return None
    return SerializableCallable


SerializableCallable: type = _serializable_callable_base() or object
"""The base class of a backend result that AOT precompile can save (`object` where torch has none)."""


def aot_precompile_available() -> bool:
    return _serializable_callable_base() is not None and hasattr(torch.compiler, "load_compiled_function")


def _aot_enabled():
    config = torch._dynamo.config
    return config.patch(enable_aot_compile=True) if hasattr(config, "enable_aot_compile") else contextlib.nullcontext()


def aot_capture(fn: Callable, backend: Callable, args: tuple, kwargs: dict, guard_filter: Callable):
    """Dynamo's whole-program capture of `fn(*args, **kwargs)` with `backend` (run once, inside), not run; the
    result is called with `fn`'s unbound arguments (`self` first for a bound method)."""
    with _aot_enabled():
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend,
                                 options={"guard_filter_fn": guard_filter})
        return compiled.aot_compile((args, kwargs))


def aot_program_bytes(program) -> bytes:
    """A captured program as bytes (what `save_compiled_function` writes, without the file)."""
    return type(program).serialize(program).serialized_data


def aot_program_load(data: bytes, f_globals: dict | None):
    """A program from `aot_program_bytes`; nothing is traced."""
    import io

    with _aot_enabled():
        return torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=f_globals)


def aot_guard_failure(program, args: tuple, kwargs: dict) -> str | None:
    """None when the program's saved guards hold for this call, else Dynamo's reason."""
    if program.guard_check(*args, **kwargs):
        return None
    try:
        return str(program._artifacts.guard_manager.check_verbose(program.prepare_f_locals(*args, **kwargs)))
    except Exception as e:  # the reason is for a log line only
        return f"(no reason: {type(e).__name__})"


def aot_import_module_aliases(program, f_globals: dict) -> list[str]:
    """Record, as imports a loading process makes itself, the modules the program's code reads through aliases
    Dynamo put into the traced function's globals by object id (`___module_collections_<id>_c0`): torch saves
    imports and picklable globals but not these, and a later process has no such name. Returns the aliases."""
    import builtins

    env = program._artifacts.runtime_env
    named = []
    for ref in sorted(env.external_refs):
        value = f_globals.get(ref)
        if ref in env.used_globals or ref in env.import_sources or hasattr(builtins, ref) or \
                not isinstance(value, types.ModuleType) or sys.modules.get(value.__name__) is not value:
            continue   # a module made at run time, not imported by name, would fail the loading process's import
        env.import_sources[ref] = value.__name__
        named.append(ref)
    return named


def aot_skip_guards(program) -> None:
    """Calls no longer evaluate the program's guards (vgc checks its inputs itself)."""
    program.disable_guard_check()


def aot_source_modules(program) -> list[str]:
    """Names of the modules whose code Dynamo traced for the program."""
    return sorted({source.module for source in program._artifacts.source_info.inlined_sources})


def aot_bytecode(program) -> tuple[Any, Any]:
    """(original code, transformed code) of a captured program, for `transformed_code.py`."""
    return program._artifacts.original_code, program._artifacts.runtime_env.bytecode


def aot_signature(program) -> inspect.Signature:
    """The signature a captured program is called with."""
    return program._artifacts.signature


def aot_backend_result(program):
    """What the backend returned for a captured or loaded program (vgc's `SavedGraph`)."""
    return program._artifacts.compiled_fn


# ---- Backend registration -----------------------------------------------------------------------------------------

def _entry_point_provides(name: str) -> bool:
    from importlib.metadata import entry_points

    try:
        return name in entry_points(group="torch_dynamo_backends").names
    except Exception:  # broken metadata must not break `import vgc`
        return False


def register_backend_by_name(name: str, backend: Callable) -> None:
    """Make `torch.compile(backend=name)` work when vgc is importable but not installed.

    Where vgc is installed, torch finds it through the `torch_dynamo_backends` entry point and registers it
    itself; registering here too would make torch's lookup fail with "duplicate name".
    """
    from torch._dynamo.backends import registry

    if name in registry._COMPILER_FNS or _entry_point_provides(name):
        return
    registry.register_backend(compiler_fn=backend, name=name)


# ---- pytrees and multi-tensor copies ------------------------------------------------------------------------------

def tree_leaves(tree) -> list:
    """The leaves of a nested structure of lists, tuples, dicts and registered classes, in torch's pytree order
    (torch 2.11-2.13 have no public pytree module)."""
    from torch.utils import _pytree

    return _pytree.tree_leaves(tree)


def tree_map(fn: Callable, tree):
    """`tree` with every leaf replaced by `fn(leaf)`, in the order of `tree_leaves`."""
    from torch.utils import _pytree

    return _pytree.tree_map(fn, tree)


def tree_flatten(tree) -> tuple[list, Any]:
    """(leaves, spec) of `tree`, for `tree_unflatten`: the same walk as `tree_leaves`."""
    from torch.utils import _pytree

    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves: list, spec):
    """The structure `spec` (from `tree_flatten`) rebuilt around `leaves`."""
    from torch.utils import _pytree

    return _pytree.tree_unflatten(leaves, spec)


def copy_many(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """`target.copy_(source)` for every pair, in one multi-tensor kernel per dtype on CUDA (the private
    `torch._foreach_copy_`)."""
    torch._foreach_copy_(targets, sources)


# ---- torch.distributed --------------------------------------------------------------------------------------------

def default_store():
    """The key-value store `torch.distributed.init_process_group` made, or None (no group, or a torch without
    the accessor: then ranks start without checking in)."""
    import torch.distributed as dist

    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    if getter is None or not dist.is_initialized():
        return None
    try:
        return getter()
    except (RuntimeError, ValueError):
        return None
