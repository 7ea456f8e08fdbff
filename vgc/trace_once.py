"""Trace once: the backend of `vgc.compile` (`TraceOnceBackend`) and the session of its first call
(`TraceSession`), which gets the one trace: loaded from the cache (no Dynamo, no Inductor), else captured with
torch's AOT precompile, built and saved beside its artifacts, else (a model a saved trace cannot serve) traced
live through Dynamo.

A saved trace is used only when it still describes the program: its entry key matches the current sources, config
and environment (`saved_traces.find`), the call meets the input contract and size assumptions it was traced with,
and the model's own state (attribute values, weight dtypes and shapes) passes the guards Dynamo saved for it. Any
other case traces; a damaged or stale file is a warning and a trace, never an error or a wrong answer.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vgc import _compat
from vgc.backend import VgcBackend
from vgc.cache import debug_files, saved_traces
from vgc.cache.entry import open_root, open_store
from vgc.cache.keys import module_source_files, user_source_files
from vgc.capture import registries
from vgc.capture.contract import InputContract
from vgc.capture.model_state import model_structure, state_mismatch, state_shapes
from vgc.capture.paths import InputMismatchError
from vgc.capture.state_values import StateValueRecorder, values_mismatch
from vgc.capture.size_guards import snapshot_shape_guards
from vgc.config import CompilationConfig, DynamicShapesType, PieceBackend
from vgc.distributed import RankFailedError
from vgc.log import warn_once
from vgc.piecewise.plan import GraphPlan, SavedGraph

logger = logging.getLogger("vgc")


class CompileAfterWarmupError(RuntimeError):
    """Raised when Dynamo asks a `vgc.compile` model, already traced once, to trace and compile again."""


class TraceOnceBackend(VgcBackend):
    """The backend of `vgc.compile`, which drops Dynamo's guards and owns the calls.

    It compiles only inside `tracing()`, the scope of its owner's single trace (any other request to compile is a
    `CompileAfterWarmupError`); records the size assumptions Inductor adds (the owner's contract checks them per
    call, since Dynamo's guards are gone); leaves FULL graphs and output lifetime to the owner's dispatcher; and
    captures piece graphs only inside `graph_runtime.capturing()`.
    """

    capture_on_demand = False

    def __init__(self, config: CompilationConfig | None = None):
        super().__init__(config)
        self._tracing = False
        self._plan_only = False
        self._check_in: Callable[[int], None] | None = None

    @contextlib.contextmanager
    def tracing(self, *, plan_only: bool = False, check_in: Callable[[int], None] | None = None):
        """The scope of the owner's trace: the only place this backend compiles. Traced without autograd, without
        duck sizing (equal sizes at trace time stay separate symbols: only relations the model really needs become
        guards, and those are checked per call), size-oblivious where the config says so.

        `plan_only` (an ahead-of-time capture): each graph is only planned, and handed back as a `SavedGraph` for
        the session to build once the traced source files, and so the cache entry, are known. `check_in`: a graph
        built here calls `check_in(collectives)` between being built and its first run (the ranks' start check-in).
        A retried trace (the first one failed, e.g. Dynamo rejected its graph) replaces the graphs of the failed
        one; when the retry reuses the code Dynamo kept from it, those graphs stay.
        """
        oblivious = self.config.dynamic_shapes_config.type == DynamicShapesType.BACKED_SIZE_OBLIVIOUS
        before = len(self.graphs)
        self._tracing, self._plan_only, self._check_in = True, plan_only, check_in
        try:
            with torch.no_grad(), _compat.no_duck_shape(), _compat.backed_size_oblivious(oblivious):
                yield
        finally:
            self._tracing, self._plan_only, self._check_in = False, False, None
            if len(self.graphs) > before:
                del self.graphs[:before]

    def __call__(self, gm, example_inputs: list, options: dict | None = None, mode: str | None = None):
        if not self._tracing:
            error = CompileAfterWarmupError(
                "vgc: Dynamo asked to trace and compile a vgc.compile model again; it traces once, on its first "
                "call, and never compiles after that, warm-up or not. With guards dropped this only happens "
                "when Dynamo lost the compiled code (torch._dynamo.reset(), a cache-size limit) or the model is "
                "called through another entry; build and warm up a new CompiledModel.")
            raise _compat.through_dynamo(error) from error
        return super().__call__(gm, example_inputs, options, mode)

    def _compile_graph(self, gm, example_inputs: list) -> Callable:
        if self._plan_only:
            plan = self._plan_graph(gm, example_inputs)
            plan.snapshot_split(keep_pieces=self.config.piece_backend == PieceBackend.EAGER)
            return SavedGraph(plan, _compat.tracing_context())
        return super()._compile_graph(gm, example_inputs)

    def _about_to_run(self, forward: Callable, plan: GraphPlan, graph_runtime) -> Callable:
        """A live trace: Dynamo runs the graph right after this, so the ranks check in now. Outputs stay in graph
        memory: the owner's dispatcher slices them, and its callers use each before the next call."""
        if self._check_in is not None:
            try:
                self._check_in(plan.collectives)
            except RankFailedError as e:
                raise _compat.through_dynamo(e) from e
        return forward

    def _compiler_guards(self, plan: GraphPlan) -> list:
        """The size assumptions Inductor added to Dynamo's while compiling (e.g. `64*s0 <= 2147483647` for 32-bit
        indexing). Dropped with Dynamo's guards, so the owner's contract turns them into per-call checks."""
        known = {str(expr) for expr, _, _ in plan.shape_guards}
        return [(expr, "Inductor's generated code", sources)
                for expr, _, sources in snapshot_shape_guards(_compat.detect_fake_mode(plan.example_inputs))
                if str(expr) not in known]

    def _full_graphs(self, gm, example_inputs: list, device_type: str, graph_runtime) -> None:
        return None   # the owner's dispatcher captures FULL graphs of the whole call

    def _piece_graph_runtime(self, device_type: str):
        runtime = super()._piece_graph_runtime(device_type)
        return runtime if self.config.resolved_cudagraph_mode(device_type).has_piecewise else None


@dataclass
class Trace:
    """What a `TraceSession` hands back: `run` calls the traced program with the model's own arguments."""
    run: Callable
    source: str               # "saved" (loaded: no Dynamo), "traced" (and saved) or "traced-live"
    output: Any = None        # the first call's output when the trace ran the call (a live trace does)
    seconds: dict[str, float] = field(default_factory=dict)


def call_forward(self, *args, **kwargs):
    """The program a saved trace of a decorated forward holds: the model's forward, looked up on its class. Torch
    saves a program's function, and what its closure holds, by module and qualified name; a decorator's wrapper
    (transformers' `can_return_tuple`, `check_model_inputs`) carries its wrapped function's name, which finds the
    wrapper. This function has a name of its own, and Dynamo traces the wrapper and what it wraps inline."""
    return type(self).forward(self, *args, **kwargs)


class TraceSession:
    """One `vgc.compile` model's first call: `load()` a saved trace (None when there is none it may use), else
    `trace()`; each returns a `Trace`. `forward` is the model's forward (or the model, a plain function),
    `signature` its signature and `arguments` the call's bound arguments; `contract` (its specs, dynamic dims,
    and what else tells traces apart) names the trace in the cache. `check_in(collectives)` is called before
    the traced program first runs the call, when the session runs it (a live trace)."""

    def __init__(self, backend: TraceOnceBackend, model: Callable, forward: Callable, signature: inspect.Signature,
                 arguments: dict[str, Any], device_type: str, contract: tuple,
                 check_in: Callable[[int], None] | None = None):
        self.backend = backend
        self.check_in = check_in   # a live trace runs the call: the ranks check in between build and run
        self.config = backend.config
        self.model = model
        self.forward = forward
        self.signature = signature
        self.traced = self.forward   # what Dynamo captures: the forward, or `call_forward` bound to the model
        self.arguments = arguments
        self.device_type = device_type
        self.specs, self.dynamic = contract[:2]
        self.identity = saved_traces.identity(self.forward, (contract, state_shapes(self.model)))
        self.structure = model_structure(self.model)
        self.seconds: dict[str, float] = {}

    # ---- whether a saved trace can serve this model ----
    def _unsupported(self) -> str | None:
        if not _compat.aot_precompile_available():
            return f"torch {torch.__version__} cannot save a Dynamo trace"
        if _compat.has_module_hooks(self.model):
            return "the model has forward hooks, which a saved trace of its forward would skip"
        function = getattr(self.forward, "__func__", self.forward)
        if not inspect.isfunction(function):
            return f"its forward is a {type(function).__name__}, not a Python function"
        if function.__name__ == "<lambda>":
            return "its forward is a lambda, which a saved trace could not tell apart from another"
        problem = saved_traces.closure_problem(function)
        bound = getattr(self.forward, "__self__", None)
        if problem is not None and bound is not None and getattr(type(bound), "forward", None) is function and \
                saved_traces.closure_problem(function, wrappers_ok=True) is None:
            # In the forward's own globals, so that what the trace names (the output's class) is found there, in
            # the saving process and in the loading one; torch pickles it by name, which finds `call_forward`.
            forwarder = types.FunctionType(call_forward.__code__, function.__globals__, call_forward.__name__)
            forwarder.__module__, forwarder.__qualname__ = call_forward.__module__, call_forward.__qualname__
            self.traced = types.MethodType(forwarder, bound)
            return None
        return problem

    def _runner(self, program) -> Callable:
        bound = getattr(self.forward, "__self__", None)
        if self.traced is self.forward:
            return functools.partial(program, bound) if bound is not None else program
        layout = self._layout

        def run(*args, **kwargs):
            args, kwargs = layout(args, kwargs)
            return program(bound, *args, **kwargs)
        return run

    def _layout(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A call as `call_forward`'s program is traced and run: every named parameter by keyword, defaults
        included. Its saved code reads `kwargs['input_ids']` as the trace found it, whether the caller (or the
        graph dispatcher, which passes them positionally) gave it by position or by name."""
        if self.traced is self.forward:
            return args, kwargs
        signature = self.signature
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        positional, keywords = [], {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                positional.extend(value)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                keywords.update(value)
            else:
                keywords[name] = value
        return tuple(positional), keywords

    # ---- a warm start ----
    def load(self, args: tuple, kwargs: dict) -> Trace | None:
        if self._unsupported() is not None:
            return None
        root = open_root(self.config)
        if root is None:
            return None
        start = time.perf_counter()
        found, stale = saved_traces.find(root, self.config, self.device_type, self.identity)
        for reason in stale:
            logger.info("saved trace not used: %s", reason)
        if found is None:
            return None
        bound = getattr(self.forward, "__self__", None)
        try:
            with registries.laid_out_for(bound):   # the guards Dynamo rebuilds here read them by position
                program = _compat.aot_program_load(saved_traces.read(found.path),
                                                   getattr(self.traced, "__globals__", None))
            saved = _compat.aot_backend_result(program)
            if not isinstance(saved, SavedGraph):
                raise saved_traces.DamagedTrace(f"it holds a {type(saved).__name__}, not a vgc graph")
        except Exception as e:   # cut short, altered, or written by another torch: trace instead
            warn_once(f"trace:{found.path}", "saved trace %s is unusable (%s: %s); tracing again", found.path,
                      type(e).__name__, e)
            self.backend.counters.add(cache_corrupt=1)
            return None
        self.seconds["load_trace"] = time.perf_counter() - start
        refusal = self._refusal(program, saved, args, kwargs)
        if refusal is not None:
            logger.info("saved trace %s not used: %s; tracing", found.path, refusal)
            return None
        start = time.perf_counter()
        store = open_store(self.config, self.device_type, found.source_paths, found.source_modules,
                           found.extra_paths, key=(found.entry, found.factors))
        if store.directory is None:   # the entry cannot be opened (warned): its artifacts cannot load either
            return None
        try:
            saved.build(self.backend, store)
        except Exception as e:   # a missing or damaged artifact, or one that fails to load: trace instead
            logger.warning("the saved trace %s could not be built (%s: %s); tracing and compiling again",
                           found.path, type(e).__name__, e)
            return None
        self.seconds["load_artifacts"] = time.perf_counter() - start
        _compat.aot_skip_guards(program)
        self.backend.counters.add(traces_loaded=1)
        return Trace(self._runner(program), "saved", seconds=self.seconds)

    def _refusal(self, program, saved: SavedGraph, args: tuple, kwargs: dict) -> str | None:
        """Why this call must not run the saved program: a size assumption it breaks, or model state that differs
        from the traced model's (a changed attribute, dtype or weight shape)."""
        plan = saved.plan
        try:
            InputContract(self.signature, self.arguments, self.specs, self.dynamic, plan.shape_guards,
                          plan.compiler_guards, conditions_level=None).check(self.arguments)
        except InputMismatchError as e:
            return f"this call breaks an assumption of the saved trace ({e})"
        if plan.structure != self.structure:
            changed = next((f"{a} -> {b}" for a, b in zip(plan.structure, self.structure) if a != b),
                           "modules were added or removed")
            return f"the model's modules or functions differ from the traced one ({changed})"
        bound = getattr(self.forward, "__self__", None)
        mismatch = state_mismatch(plan.state_tensors, {"self": bound}) or \
            values_mismatch(plan.state_values, {"self": bound})
        if mismatch is not None:
            return f"the model differs from the traced one: {mismatch}"
        with torch.no_grad(), registries.laid_out_for(bound):
            args, kwargs = self._layout(args, kwargs)
            failure = _compat.aot_guard_failure(program, ((bound,) if bound is not None else ()) + tuple(args),
                                                kwargs)
        return None if failure is None else f"the model differs from the traced one: {failure}"

    # ---- a cold start ----
    def trace(self, args: tuple, kwargs: dict) -> Trace:
        reason = self._unsupported()
        if reason is None:
            try:
                return Trace(self._capture(args, kwargs), "traced", seconds=self.seconds)
            except Exception as e:   # torch could not capture or save this program: Dynamo's own entry still can
                if self.backend.graphs:
                    raise
                reason = f"{type(e).__name__}: {e}"
        logger.info("trace not saved (%s); tracing through Dynamo's entry", reason)
        start = time.perf_counter()
        compiled = torch.compile(self.model, backend=self.backend, fullgraph=True, dynamic=False,
                                 options={"guard_filter_fn": _compat.skip_all_guards})
        with self.backend.tracing(check_in=self.check_in):
            out = compiled(*args, **kwargs)
        self.seconds["trace_and_compile"] = time.perf_counter() - start
        return Trace(compiled, "traced-live", out, self.seconds)

    def _capture(self, args: tuple, kwargs: dict) -> Callable:
        start = time.perf_counter()
        bound = getattr(self.forward, "__self__", None)
        # The model's plain attribute values the trace reads are vgc's to check at a load, not Dynamo's guards'
        recorder = StateValueRecorder(bound) if bound is not None else None
        with self.backend.tracing(plan_only=True), registries.laid_out_for(bound):
            program = _compat.aot_capture(self.traced, self.backend, *self._layout(args, kwargs),
                                          _compat.model_state_guard_filter(
                                              set(self.arguments), recorder.take_over if recorder else None))
        function = getattr(self.forward, "__func__", self.forward)
        # The program is what Dynamo traced: for a decorated forward (transformers' `can_return_tuple`), the
        # decorator's wrapper, which the model's calls go through too.
        own = inspect.signature(getattr(self.traced, "__func__", self.traced), follow_wrapped=False)
        if _compat.aot_signature(program) != own:
            raise RuntimeError(f"the captured program takes {_compat.aot_signature(program)}, not the forward's "
                               f"{own}")
        _compat.aot_import_module_aliases(program, getattr(self.traced, "__globals__", {}))
        saved = _compat.aot_backend_result(program)
        saved.plan.structure = self.structure
        saved.plan.state_values = recorder.values if recorder else []
        # Torch names the traced code by module; code in a file Python did not import as a module (loaded by
        # path) is missing there, and is found by the files Dynamo recorded on the graph's operations.
        modules = _compat.aot_source_modules(program)
        module_paths = module_source_files(modules)
        if module_paths is None:
            raise RuntimeError("a module the trace read has no source file to key the cache by")
        extra = [p for p in user_source_files([*saved.plan.code_files, function.__code__.co_filename])
                 if p not in module_paths]
        self.seconds["trace"] = time.perf_counter() - start
        start = time.perf_counter()
        store = open_store(self.config, self.device_type, sorted({*module_paths, *extra}), modules, extra)
        with self.backend.tracing():
            saved.build(self.backend, store)
        self.seconds["compile_or_load"] = time.perf_counter() - start
        self._save(program, store)
        saved.plan.forget_trace()
        _compat.aot_skip_guards(program)
        return self._runner(program)

    def _save(self, program, store) -> None:
        if store.directory is None or not store.saving:
            return
        start = time.perf_counter()
        try:
            path = saved_traces.save(store.directory, self.identity, _compat.aot_program_bytes(program))
        except Exception as e:   # the model still runs; the next start traces again
            warn_once(f"save-trace:{store.directory}", "could not save the trace under %s (%s: %s); the next start "
                      "traces again", store.directory, type(e).__name__, e)
            return
        self.backend.counters.add(traces_saved=1)
        debug_files.write_transformed_code(store, *_compat.aot_bytecode(program))
        self.seconds["save_trace"] = time.perf_counter() - start
        logger.info("saved the trace to %s", path)
