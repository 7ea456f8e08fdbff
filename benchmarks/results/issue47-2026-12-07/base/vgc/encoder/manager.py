"""`EncoderCudaGraphManager`: a vision encoder as CUDA graphs at a few token budgets, with greedy packing.

At start-up (`capture()`) the manager compiles the model's fixed-shape forward with vgc (one symbolic-size
compile serves every budget, and a warm start loads it from the compile cache) and captures one graph per
budget, largest first, into one memory pool. `execute(mm_kwargs)` packs the items into sub-batches, replays the
smallest graph that holds each (items over every budget run the model's eager forward; a sub-batch whose padding
costs more than its graph saves runs the compiled forward at its own size) and returns one output per item in
the caller's order. Everything model-specific goes through `SupportsEncoderCudaGraph`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import time
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist

from vgc import _compat, cuda_runtime, log  # module attribute access: tests substitute capture()
from vgc.api import CompiledModel
from vgc.config import CompilationConfig, CUDAGraphMode
from vgc.counters import Counters, counters
from vgc.cudagraph import traffic
from vgc.cudagraph.captured import capture_graph, CaptureLoop, CapturedGraph
from vgc.cudagraph.memory import GraphMemory
from vgc.encoder import data_parallel
from vgc.encoder.pack import budget_levels, pack, PathBudgets, SubBatch
from vgc.encoder.protocol import (BudgetGraphMetadata, DEFAULT_PATH, EncoderCudaGraphConfig, EncoderItemSpec,
                                  GLOBAL_PATH, LOCAL_PATH, missing_methods)

logger = logging.getLogger("vgc")

_LOG_EVERY_ITEMS = 1000
_MAX_SLOTS = 256           # default: the largest budget holds at most this many of the smallest budget
_MIN_GRAPH_SAVING = 0.02   # a budget whose graph saves less than this of the compiled forward's time
_TIMED_RUNS = 3


class EncoderCompileError(RuntimeError):
    """vgc could not compile an encoder path's forward; `capture()` raises it unless told to capture the model's
    own forward instead (`on_compile_failure="model_forward"`)."""


_ON_COMPILE_FAILURE = ("raise", "model_forward")


class EncoderCudaGraphManager:
    """Budget CUDA graphs for one encoder. `config` defaults to `CompilationConfig(cudagraph_mm_encoder=True)`;
    with `cudagraph_mm_encoder=False` (or off CUDA) the same packing runs the compiled forward without graphs.

    `compile=False` records the model's own forward instead of vgc's compiled one. When vgc's compile of a path's
    forward fails, `capture()` raises `EncoderCompileError` (`on_compile_failure="raise"`, the default: graphs of
    an uncompiled forward replay, but slower, and that should not pass unnoticed); with
    `on_compile_failure="model_forward"` it warns and captures the model's own forward for that path.
    `data_parallel` (default: on when `torch.distributed` is initialised with more than one rank in `group`)
    shares the items of every `execute` among the ranks, which must all call it with the same batch. `calibrate`
    (default: on a CUDA device) times every graph against the compiled forward at start-up and runs a sub-batch
    at its own size, without its graph, when the padding would cost more than the graph saves (large,
    compute-bound batches).

    Serving limits are the caller's, not the model's: `min_budget` (tokens) is the smallest budget worth a graph
    (default: the model's smallest item, or 1/256 of the largest budget if that is more), and a graph of budget b
    carries b // min_budget attention slots (the largest: all); the items in one sub-batch default to
    largest // min_budget (`encoder_cudagraph_max_vision_items_per_batch` overrides), and
    the attention slots of the largest graph to as many, or more where the items' video frames may need them
    but at most one per min_budget tokens (`encoder_cudagraph_max_frames_per_batch` overrides).
    """

    def __init__(self, model: Any, config: CompilationConfig | None = None, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, compile: bool = True, data_parallel: bool | None = None,
                 group: Any = None, calibrate: bool | None = None, on_compile_failure: str = "raise",
                 min_budget: int | None = None, record: str | None = None):
        if on_compile_failure not in _ON_COMPILE_FAILURE:
            raise ValueError(f"on_compile_failure must be one of {list(_ON_COMPILE_FAILURE)}, got "
                             f"{on_compile_failure!r}")
        self.on_compile_failure = on_compile_failure
        if min_budget is not None and (isinstance(min_budget, bool) or not isinstance(min_budget, int) or
                                       min_budget < 1):
            raise ValueError(f"min_budget must be a positive int (tokens), got {min_budget!r}")
        self.min_budget = min_budget
        missing = missing_methods(model)
        if missing:
            raise TypeError(f"{type(model).__name__} does not implement SupportsEncoderCudaGraph: it lacks "
                            f"{', '.join(missing)} (see vgc.encoder.SupportsEncoderCudaGraph)")
        self.model = model
        self.config = config if config is not None else CompilationConfig(cudagraph_mm_encoder=True)
        self.model_config: EncoderCudaGraphConfig = model.get_encoder_cudagraph_config()
        # a profile is checked now: a bad file fails the manager's construction, not the start it would shape
        self.profile = traffic.load_profile(self.config.cudagraph_traffic_profile, "encoder") \
            if self.config.cudagraph_traffic_profile else None
        self.recorder = traffic.TrafficRecorder(record, "encoder") if record is not None else None
        self.device, self.dtype = _placement(model, device, dtype)
        self.use_graphs = bool(self.config.cudagraph_mm_encoder) and cuda_runtime.graphs_supported(self.device)
        if self.config.cudagraph_mm_encoder and not self.use_graphs:
            logger.info("encoder CUDA graphs need a CUDA device (the encoder is on %s): the compiled encoder runs "
                        "without graphs", self.device)
        self.paths = self._resolve_budgets()
        self.group = group
        self.data_parallel = data_parallel if data_parallel is not None else (
            dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1)
        self._compile = compile
        self._writes_in_place = "out" in inspect.signature(model.prepare_encoder_cudagraph_replay_buffers).parameters
        self._forwards: dict[str, Callable] = {}
        self.compile_errors: dict[str, str] = {}   # per path: why vgc's compile failed (the plain forward runs)
        self.graphs: dict[str, dict[int, BudgetGraphMetadata]] = {path: {} for path in self.paths}
        # timing graphs against the plain forward means something only on a real GPU (not the CPU stand-in)
        self.calibrate = calibrate if calibrate is not None else self.device.type == "cuda"
        self.graph_savings: dict[str, dict[int, float]] = {path: {} for path in self.paths}
        self.counters = Counters.child_of(counters)
        self._pool = None
        self.memory = GraphMemory(None if self.config.cudagraph_memory_budget_mb is None
                                  else self.config.cudagraph_memory_budget_mb * 2 ** 20)
        self._captured = False
        self._seconds: dict[str, float] = {}
        self._items = {"hit": 0, "missed": 0}
        self._path_items: dict[str, dict[str, int]] = {p: {"replayed": 0, "exact": 0, "eager": 0} for p in self.paths}
        self._replays: dict[str, dict[int, int]] = {p: defaultdict(int) for p in self.paths}
        self._tokens = {"real": 0, "padded": 0, "replayed": 0}   # replayed: the budgets of every replay
        self._logged_at = 0

    # ---- budgets ----
    def _resolve_budgets(self) -> dict[str, PathBudgets]:
        smallest, largest = self.model.get_encoder_cudagraph_budget_range(self.config)
        if not (isinstance(smallest, int) and isinstance(largest, int) and 1 <= smallest <= largest):
            raise ValueError(f"{type(self.model).__name__}.get_encoder_cudagraph_budget_range() must return "
                             f"(smallest, largest) ints with 1 <= smallest <= largest, got ({smallest}, {largest})")
        chosen = list(self.config.encoder_cudagraph_token_budgets)
        # The smallest budget worth a graph is a serving choice, not the smallest item the model takes (Qwen2-VL
        # takes 4-token images): by default at most _MAX_SLOTS of it fill the largest budget, which bounds the
        # items per sub-batch and so the attention slots every graph carries.
        useful = min(largest, self.min_budget or max(smallest, largest // _MAX_SLOTS))
        max_items = self.config.encoder_cudagraph_max_vision_items_per_batch or max(1, largest // useful)
        # a slot per frame the items may bring, but no more than min_budget-sized sequences fill the largest budget
        max_frames = self.config.encoder_cudagraph_max_frames_per_batch or max(
            max_items, min(max_items * max(1, self.model_config.max_frames_per_video), largest // useful))
        if not self.model_config.enable_dual_path_graph:
            budgets = chosen or self._profile_budgets(DEFAULT_PATH, useful, largest) or budget_levels(useful, largest)
            # slots per graph: one per min_budget tokens (b // 4 slots for 4-token images made chat requests on the
            # HF Qwen2-VL tower 18% slower on the H200 than b // 64; benchmarks/encoder_slots.py)
            return {DEFAULT_PATH: PathBudgets(tuple(budgets), max_items, max_frames, unit=useful)}
        paths = {}
        for path in (GLOBAL_PATH, LOCAL_PATH):
            unit = self.model_config.tokens_per_unit(path)
            if unit < 1:
                raise ValueError(f"a dual-path encoder config needs global_token_per_image and "
                                 f"local_token_per_patch >= 1, got {path} {unit}")
            if chosen:   # the user's budgets, rounded up to whole images or patches of this path
                levels = sorted({math.ceil(b / unit) * unit for b in chosen})
            elif profiled := self._profile_budgets(path, unit, max(unit, largest // unit * unit)):
                levels = profiled
            else:
                levels = budget_levels(unit, max(unit, largest // unit * unit), unit=unit)
            zero = [0] if path == LOCAL_PATH else []   # images without local patches skip that path
            paths[path] = PathBudgets(tuple(zero + levels), max_items, max_frames)
        return paths

    def _profile_budgets(self, path: str, unit: int, largest: int) -> list[int] | None:
        """The budgets (multiples of `unit`, at most `largest`) that minimise the padded tokens of the sub-batches
        the traffic profile recorded on `path`; None without a profile or a record of that path."""
        if self.profile is None:
            return None
        histogram = {n: c for n, c in self.profile.histograms.get(f"{path}.tokens", {}).items() if n <= largest}
        if not histogram:
            logger.warning("encoder: the traffic profile %s records no sub-batch of at most %d tokens on path %r; "
                           "that path keeps the default budgets", self.config.cudagraph_traffic_profile, largest, path)
            return None
        candidates = sorted({*range(unit, largest + 1, unit), largest})
        budgets = traffic.choose_sizes(histogram, self.config.cudagraph_max_graphs, candidates=candidates)
        logger.info("encoder %s path: budgets from the traffic profile: %s", path, budgets)
        return budgets

    # ---- start-up ----
    def capture(self) -> dict[str, Any]:
        """Compile the encoder (or load it from the compile cache) and capture every budget's graph (largest
        first, one pool); returns `stats()`. Nothing compiles or captures after this."""
        if self._captured:
            return self.stats()
        start = time.perf_counter()
        paths = [path for path, levels in self.paths.items() if levels.largest > 0]
        todo = [(path, b) for path in paths for b in self._capture_order(path) if b > 0]
        traced = paths if self._compile else []
        if not self.use_graphs:
            todo = []
        with log.progress(len(traced), "vgc: encoder compile", unit="path") as bar, torch.no_grad():
            for path in traced:
                self._trace(path)
                bar.update(1)
        self._seconds["compile"] = time.perf_counter() - start
        loop = CaptureLoop(self.memory, self.device, "encoder graphs")
        if todo:   # no device calls for a model without graphs (it may be on the CPU)
            with torch.no_grad(), loop.running(len(todo)):
                for path, budget in todo:
                    self._capture_one(loop, path, budget)
        self._seconds["capture"] = loop.seconds
        if todo and self.calibrate:
            with torch.no_grad():
                for path in paths:
                    self._calibrate(path)
            self._seconds["calibrate"] = time.perf_counter() - start - sum(self._seconds.values())
        self._captured = True
        logger.info("encoder: compiled in %.2f s, captured %d graphs in %.2f s (budgets %s), %s",
                    self._seconds["compile"], len(self.memory.per_size), self._seconds["capture"],
                    {p: list(b.budgets) for p, b in self.paths.items()}, self.memory.summary())
        return self.stats()

    def _capture_order(self, path: str) -> list[int]:
        """Largest first (the later graphs reuse its blocks); then, with a traffic profile of the path, by the
        padding each budget saves per token (what a memory budget keeps), else by size."""
        budgets = sorted(self.paths[path].budgets, reverse=True)
        histogram = self.profile.histograms.get(f"{path}.tokens") if self.profile is not None else None
        return traffic.value_order(histogram, budgets) if histogram else budgets

    def _trace(self, path: str) -> None:
        """Trace and compile the path's forward once, at a budget no size of the model can equal.

        A traced size that happens to equal a fixed size (a budget of 256 tokens in a 256-wide model) can be
        compared with it while tracing, and the comparison then pins the dynamic size to that value. The trace
        runs at a prime number of units (tokens, or whole views on a dual path) just above the largest budget,
        chosen so that in the capture buffers it makes, whatever their layout (patches = 4 x tokens, slots =
        items + 1), no budget-sized dim equals a fixed one (of the model's weights or of a buffer's other dims),
        and the prime divides no fixed size (so no multiple of it is one either).
        """
        unit = self.model_config.tokens_per_unit(path)
        fixed = _fixed_sizes(self.model)
        units = _next_prime(self.paths[path].largest // unit + 1)
        for _ in range(64):
            inputs = self._capture_inputs(path, unit * units)
            sizes = _budget_sizes(inputs, self.model_config)
            clash = sizes & (fixed | _static_sizes(inputs, self.model_config))
            if not clash and not any(d % units == 0 for d in fixed):
                break
            units = _next_prime(units + 1)
        try:
            self._forward_at(path, unit * units, inputs)
        except Exception as error:   # any compile failure (e.g. a dynamic size the tracer pinned on this torch)
            cause = error
            while cause.__cause__ is not None:   # Dynamo wraps what the backend raised
                cause = cause.__cause__
            first_line = (str(cause).splitlines() or [""])[0]
            if self.on_compile_failure == "raise":
                raise EncoderCompileError(
                    f"vgc could not compile the encoder's {path!r} forward ({type(cause).__name__}: {first_line}); "
                    "fix the model's forward for torch.compile, or pass on_compile_failure='model_forward' to "
                    "capture the model's own forward (graphs still replay, slower)") from error
            # Graphs of the model's own forward still remove the launch overhead.
            logger.warning("vgc could not compile the encoder's %s forward (%s: %s); capturing the model's own "
                           "forward instead", path, type(cause).__name__, first_line)
            self.compile_errors[path] = f"{type(cause).__name__}: {first_line}"
            self._forwards[path] = self._plain_forward(path)
            self._forward_at(path, self.paths[path].largest)   # a model whose own forward fails stops here

    def _capture_inputs(self, path: str, budget: int) -> dict[str, torch.Tensor]:
        max_items, max_frames = self.paths[path].capacity(budget)
        inputs = self.model.prepare_encoder_cudagraph_capture_inputs(budget, max_items, max_frames, self.device,
                                                                     self.dtype, path=path)
        return dict(inputs.values)

    def _forward_at(self, path: str, budget: int, values: dict[str, torch.Tensor] | None = None
                    ) -> tuple[Callable, dict[str, torch.Tensor]]:
        """Run the path's forward once on its capture inputs for `budget` (made here unless given): the first run
        of a path traces and compiles; later ones load kernels and autotune for that size."""
        values = values if values is not None else self._capture_inputs(path, budget)
        forward = self._forward(path, values)
        forward(values)
        return forward, values

    def _capture_one(self, loop: CaptureLoop, path: str, budget: int) -> None:
        """Capture `budget`'s graph on `path`, unless the memory budget has no room for it or the capture runs out
        of memory: that budget's sub-batches then run the compiled forward at their own size."""
        max_items, max_frames = self.paths[path].capacity(budget)

        def capture(warmed) -> CapturedGraph:
            forward, values = warmed
            if self._pool is None:
                self._pool = cuda_runtime.new_pool()
            # capture_graph replays once: a graph that cannot run fails here, at start-up, not on a request
            return capture_graph(lambda: forward(values), self._pool, held=values)

        captured = loop.capture(f"{path}:{budget}", budget, capture,
                                first_estimate=lambda: self._run_peak_bytes(path, budget),
                                warm=lambda: self._forward_at(path, budget))
        if captured is None:
            return
        if not isinstance(captured.outputs, torch.Tensor):
            raise TypeError(f"encoder_cudagraph_forward(path={path!r}) must return one tensor, got "
                            f"{type(captured.outputs).__name__}")
        self.graphs[path][budget] = BudgetGraphMetadata(path, budget, max_items, max_frames, captured, captured.held,
                                                        captured.outputs, memory_bytes=captured.memory_bytes)
        self.counters.add(cudagraph_captures=1)

    def _run_peak_bytes(self, path: str, budget: int) -> int:
        """The peak memory the path's forward allocates at `budget`: what the first graph keeps as its pool."""
        values = self._capture_inputs(path, budget)
        return cuda_runtime.peak_allocated_by(lambda: self._forward(path, values)(values), self.device)

    def _calibrate(self, path: str) -> None:
        """Time each budget's graph against the compiled forward at the same size, smallest budget first, and
        keep the fraction of time the graph saves. A sub-batch replays its budget only while its padding (a
        fraction of the budget) costs less than that; otherwise the compiled forward runs at its own size.

        The saving shrinks as budgets grow (launch overhead is fixed, work is not); once a budget saves less
        than `_MIN_GRAPH_SAVING`, the larger ones are not timed and run without their graphs.
        """
        savings = self.graph_savings[path]
        for budget in sorted(self.graphs[path]):
            meta = self.graphs[path][budget]
            forward = self._forward(path, meta.input_buffers)
            replay = _median_seconds(meta.graph.replay, self.device)
            plain = _median_seconds(lambda: forward(meta.input_buffers), self.device)
            savings[budget] = max(0.0, 1.0 - replay / plain) if plain > 0 else 0.0
            if savings[budget] < _MIN_GRAPH_SAVING:
                savings.update({b: 0.0 for b in self.graphs[path] if b > budget})
                break
        logger.info("encoder %s path: graphs save %s of the compiled forward's time per budget", path,
                    {b: f"{s:.0%}" for b, s in sorted(savings.items())})

    def _replays_pay(self, path: str, budget: int, tokens: int) -> bool:
        if budget not in self.graphs[path]:   # skipped: no room in the memory budget, or out of memory
            return False
        if not self.calibrate:
            return True
        return (budget - tokens) / budget <= self.graph_savings[path].get(budget, 0.0)

    def _plain_forward(self, path: str) -> Callable:
        model = self.model

        def encoder_forward(inputs):
            return model.encoder_cudagraph_forward(inputs, path=path)

        return encoder_forward

    def _forward(self, path: str, values: dict[str, torch.Tensor]) -> Callable:
        if path in self._forwards:
            return self._forwards[path]
        forward = self._plain_forward(path)
        if self._compile:
            forward = self._compiled_forward(path, tuple(values))
        self._forwards[path] = forward
        return forward

    def _compiled_forward(self, path: str, keys: tuple[str, ...]) -> Callable:
        """The path's forward compiled by `vgc.compile`, its buffers passed as top-level tensor arguments named by
        their keys (the form vgc's decoders use: each dynamic dim marked on an argument of its own), taking and
        returning what the plain forward does."""
        if not all(key.isidentifier() for key in keys):
            raise ValueError(f"encoder buffer keys must be Python identifiers to be compiled, got {list(keys)}")
        model = self.model

        shared = [[(keys.index(key), dim) for key, dim in pairs] for pairs in self.model_config.shared_dims(keys)]

        def encoder_forward(*tensors):
            # Traced sizes are separate symbols unless related; buffers the model says share a size are related
            # here, before any kernel sees them (two unrelated symbols of one size confuse Inductor's codegen).
            for (first, first_dim), *others in shared:
                for index, dim in others:
                    _compat.assume_equal(tensors[index].shape[dim], tensors[first].shape[first_dim])
            return model.encoder_cudagraph_forward(dict(zip(keys, tensors)), path=path)

        encoder_forward.__signature__ = inspect.Signature(
            [inspect.Parameter(key, inspect.Parameter.POSITIONAL_ONLY) for key in keys])
        dims = {k: d for k, d in self.model_config.token_dims.items() if k in keys}
        # the forward compiles without graphs of its own: the manager's graphs and traffic profile are not its
        config = dataclasses.replace(self.config, cudagraph_mode=CUDAGraphMode.NONE, cudagraph_traffic_profile=None,
                                     cudagraph_memory_budget_mb=None)
        compiled = CompiledModel(encoder_forward, config, dynamic_arg_dims=dims or None)
        return lambda values: compiled(*(values[key] for key in keys))

    # ---- serving ----
    def execute(self, mm_kwargs: dict) -> list[torch.Tensor]:
        """The encoder output of every item in `mm_kwargs`, in their order."""
        if not self._captured:
            raise RuntimeError("EncoderCudaGraphManager.execute() before capture(): call capture() at start-up, "
                               "so that no request compiles or captures")
        if not self.data_parallel:
            return self._execute_local(mm_kwargs)
        specs = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        shares = data_parallel.balance([s.input_size for s in specs], dist.get_world_size(self.group))
        mine = shares[dist.get_rank(self.group)]
        local = self._execute_local(self.model.select_encoder_cudagraph_items(mm_kwargs, mine)) if mine else []
        return data_parallel.gather(local, shares, self.group)

    def record(self, mm_kwargs: dict) -> None:
        """Record the sub-batches `mm_kwargs` would run as (`record=PATH`), without running them: a profile of
        requests that are at hand but not worth serving (another seed, a log of past requests)."""
        if self.recorder is None:
            raise RuntimeError("EncoderCudaGraphManager.record() needs EncoderCudaGraphManager(..., record=PATH)")
        specs = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        for batch in pack(specs, self.paths, max(p.max_items for p in self.paths.values())):
            self._record_batch(batch)

    def _record_batch(self, batch: SubBatch) -> None:
        for path in self.paths:
            if batch.budgets[path] != 0:
                self.recorder.add(f"{path}.tokens", batch.tokens[path])
                self.recorder.add(f"{path}.items", len(batch.indices))

    def _execute_local(self, mm_kwargs: dict) -> list[torch.Tensor]:
        specs = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        outputs: list[torch.Tensor | None] = [None] * len(specs)
        with torch.no_grad():
            for batch in pack(specs, self.paths, max(p.max_items for p in self.paths.values())):
                results = self._run(batch, mm_kwargs, specs)
                for index, result in zip(batch.indices, results):
                    outputs[index] = result
        self._maybe_log()
        return outputs

    def _run(self, batch: SubBatch, mm_kwargs: dict, specs: list[EncoderItemSpec]) -> list[torch.Tensor]:
        items = self.model.select_encoder_cudagraph_items(mm_kwargs, list(batch.indices))
        by_path, hit = {}, True
        if self.recorder is not None:
            self._record_batch(batch)
        for path in self.paths:
            budget, tokens = batch.budgets[path], batch.tokens[path]
            if budget == 0:
                by_path[path] = None
                continue
            if budget is None:
                by_path[path] = self.model.encoder_eager_forward(items, path=path)
                counters.encoder_eager_runs += 1
                self._path_items[path]["eager"] += len(batch.indices)
                hit = False
                continue
            by_path[path] = self._run_budget(path, budget, tokens, items, len(batch.indices))
        self._items["hit" if hit else "missed"] += len(batch.indices)
        main = by_path.get(DEFAULT_PATH, by_path.get(GLOBAL_PATH))
        results = self.model.postprocess_encoder_output(main, items, [specs[i] for i in batch.indices],
                                                        local_output=by_path.get(LOCAL_PATH))
        if len(results) != len(batch.indices):
            raise ValueError(f"postprocess_encoder_output returned {len(results)} outputs for "
                             f"{len(batch.indices)} items")
        return results

    def _run_budget(self, path: str, budget: int, tokens: int, items: dict, count: int) -> torch.Tensor:
        max_items, max_frames = self.paths[path].capacity(budget)
        self._tokens["real"] += tokens
        if not self.use_graphs or not self._replays_pay(path, budget, tokens):
            # the compiled forward at the sub-batch's own size: no padding to pay for
            values = self.model.prepare_encoder_cudagraph_replay_buffers(items, max_items, max_frames,
                                                                         path=path).values
            values = {k: v for k, v in values.items() if v is not None}
            self._path_items[path]["exact"] += count
            return self._forward(path, values)(values)[:tokens]
        self._tokens["padded"] += budget - tokens
        self._tokens["replayed"] += budget
        meta = self.graphs[path][budget]
        # A model that takes `out` writes values straight into the captured buffers (one copy of the pixels)
        into = {"out": meta.input_buffers} if self._writes_in_place else {}
        values = self.model.prepare_encoder_cudagraph_replay_buffers(items, max_items, max_frames, path=path,
                                                                     **into).values
        for key, buffer in meta.input_buffers.items():
            value = values.get(key)
            if value is not None:
                self._fill(key, buffer, value)
        meta.graph.replay()
        counters.encoder_replays += 1
        self._path_items[path]["replayed"] += count
        self._replays[path][budget] += 1
        return meta.output_buffer[:tokens].clone()   # the next replay of this graph overwrites the buffer

    def _fill(self, key: str, buffer: torch.Tensor, value: torch.Tensor) -> None:
        logic = self.model_config.padding_logics.get(key)
        if logic is not None:
            logic(buffer, value)
            return
        dim = self.model_config.token_dim(key) or 0
        written = _leading_view(value, buffer, dim)   # the model wrote these rows in place: pad the rest only
        if value.shape == buffer.shape:
            if not written:
                buffer.copy_(value)
            return
        rows = value.shape[dim] if value.dim() else 0
        fits = value.dim() == buffer.dim() and rows <= buffer.shape[dim] and all(
            value.shape[d] == buffer.shape[d] for d in range(value.dim()) if d != dim)
        if not fits:
            raise ValueError(f"replay value {key!r} of shape {tuple(value.shape)} does not fit its captured buffer "
                             f"{tuple(buffer.shape)} (dim {dim} grows with the budget); the model's "
                             "prepare_encoder_cudagraph_replay_buffers and capture inputs disagree")
        if not written:
            buffer.narrow(dim, 0, rows).copy_(value)
        buffer.narrow(dim, rows, buffer.shape[dim] - rows).zero_()   # only the padding: the rest was just written

    # ---- reporting ----
    def stats(self) -> dict[str, Any]:
        items = self._items["hit"] + self._items["missed"]
        replayed, real = self._tokens["replayed"], self._tokens["real"]
        return {
            "graphs": self.use_graphs,
            "budgets": {p: list(b.budgets) for p, b in self.paths.items()},
            "max_items_per_batch": {p: b.max_items for p, b in self.paths.items()},
            "max_frames_per_batch": {p: b.max_frames for p, b in self.paths.items()},
            "captured": {p: sorted(g) for p, g in self.graphs.items()},
            "graph_memory_bytes": {p: {b: m.memory_bytes for b, m in sorted(g.items())}
                                   for p, g in self.graphs.items()},
            "graph_memory": self.memory.report(),
            "items_hit": self._items["hit"], "items_missed": self._items["missed"],
            "hit_rate": self._items["hit"] / items if items else None,
            "path_items": {p: dict(v) for p, v in self._path_items.items()},
            "replays": {p: dict(sorted(r.items())) for p, r in self._replays.items()},
            "graph_savings": {p: dict(sorted(s.items())) for p, s in self.graph_savings.items()},
            "padding_waste": self._tokens["padded"] / replayed if replayed else (0.0 if real else None),
            "tokens": dict(self._tokens),
            "seconds": dict(self._seconds),
            "compile_errors": dict(self.compile_errors),
            # which forward each path's graphs run: vgc's compiled one, or the model's own
            "captured_forward": {p: "compiled" if self._compile and p not in self.compile_errors else "model"
                                 for p in self.paths},
            "counters": self.counters.as_dict(per_call=False),
        }

    def _maybe_log(self) -> None:
        items = self._items["hit"] + self._items["missed"]
        if items - self._logged_at < _LOG_EVERY_ITEMS:
            return
        self._logged_at = items
        stats = self.stats()
        logger.info("encoder graphs: %d items, hit rate %.1f%%, padding %.1f%% of replayed tokens", items,
                    100 * stats["hit_rate"], 100 * (stats["padding_waste"] or 0))


def _placement(model: Any, device: torch.device | str | None, dtype: torch.dtype | None) -> tuple[torch.device,
                                                                                                 torch.dtype]:
    """Where the encoder runs and in what dtype: as given, else the model's own (its first parameter's, or its
    `device` and `dtype` attributes, as transformers models have). A model with neither must be told: a default
    would put a GPU model's buffers on the CPU, in fp32, without a word."""
    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    if device is None:
        device = first.device if first is not None else getattr(model, "device", None)
    if dtype is None:
        dtype = first.dtype if first is not None else getattr(model, "dtype", None)
    if device is None or not isinstance(dtype, torch.dtype):
        raise ValueError(f"{type(model).__name__} has no parameters (nor `device` and `dtype` attributes) to take the "
                         "encoder's device and dtype from; pass EncoderCudaGraphManager(model, device=..., "
                         "dtype=...)")
    return torch.device(device), dtype


def _leading_view(value: torch.Tensor, buffer: torch.Tensor, dim: int) -> bool:
    """Whether `value` is `buffer`'s leading rows along `dim` (written there in place), not a tensor of its own."""
    return (value.data_ptr() == buffer.data_ptr() and value.dim() == buffer.dim() and
            value.stride() == buffer.stride() and
            all(value.shape[d] == buffer.shape[d] for d in range(value.dim()) if d != dim % max(value.dim(), 1)))


def _fixed_sizes(model: Any) -> set[int]:
    """The sizes (> 1) of the model's weights: a module's, or those of the modules an adapter object holds."""
    modules = [model] if isinstance(model, torch.nn.Module) else \
        [v for v in vars(model).values() if isinstance(v, torch.nn.Module)] if hasattr(model, "__dict__") else []
    return {d for m in modules for t in (*m.parameters(), *m.buffers()) for d in t.shape if d > 1}


def _budget_sizes(inputs: dict[str, torch.Tensor], config: EncoderCudaGraphConfig) -> set[int]:
    return {t.shape[d] for k, t in inputs.items() if (d := config.token_dim(k)) is not None}


def _static_sizes(inputs: dict[str, torch.Tensor], config: EncoderCudaGraphConfig) -> set[int]:
    """The sizes (> 1) of the buffers' dims that do not grow with the budget (e.g. a patch's 1176 values)."""
    sizes = set()
    for key, tensor in inputs.items():
        grows = config.token_dim(key)
        grows = grows % tensor.dim() if grows is not None and tensor.dim() else None
        sizes |= {n for d, n in enumerate(tensor.shape) if n > 1 and d != grows}
    return sizes


def _median_seconds(fn: Callable[[], Any], device) -> float:
    """Median wall time of `fn` over `_TIMED_RUNS` runs after one untimed run, synchronizing around each."""
    fn()
    times = []
    for _ in range(_TIMED_RUNS):
        cuda_runtime.synchronize(device)
        start = time.perf_counter()
        fn()
        cuda_runtime.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _next_prime(n: int) -> int:
    """The smallest prime >= n."""
    candidate = max(2, n)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate
