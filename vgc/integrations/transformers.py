"""transformers `generate()` served the way vLLM serves its own models, for an unmodified Hugging Face decoder.

    from vgc.integrations import transformers as vgc_transformers
    model = vgc_transformers.compile(model, max_batch_size=8, max_cache_len=2048)
    model.vgc.warmup()          # optional: the first generate() does it; every compile and capture happens here
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=128)

The model runs on flattened tokens, as vLLM's models do. `compile` registers vgc's attention with transformers'
`AttentionInterface` (as "vgc") and switches the model to it, and wraps `model.forward` and `model.generate`:
- generate() gets a `VgcCache`, a transformers `Cache` that holds each sequence's length; the K/V themselves
  live in vgc's paged cache, allocated once (one stripe of blocks per batch row), so CUDA graphs read them in
  place.
- each forward turns transformers' padded [batch, new tokens] call into a flat batch: the real tokens only, their
  positions, cache slots and per-sequence lengths. `vgc.compile` of the model runs it. The attention function
  calls `vgc::attention`, the op vgc splits at, which writes the new K/V and attends over each sequence's own
  length. So the compiled pieces' shapes follow the token count alone, whatever the KV length: a decode step at
  batch B is a uniform decode batch of B tokens, padded up to a capture size and replayed as one FULL CUDA graph;
  prefill runs on piece graphs (or, above the largest capture size, on the compiled pieces without graphs).

What transformers does around the forward (logits processors, sampling, stopping, EOS, padding of finished rows)
is left to generate() itself, so its tokens are eager's.

Vision towers (Qwen2-VL, Qwen2.5-VL, SigLIP, CLIP) get encoder CUDA graphs in one line,
`encoder_manager(model.visual)`: the adapters live in `vgc.integrations.vision_towers`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import weakref
from typing import Any

import torch

from vgc import _compat
from vgc.api import compile as vgc_compile
from vgc.api import CompiledModel
from vgc.capture import model_copy
from vgc.config import CompilationConfig, CUDAGraphMode
from vgc.counters import counters
from vgc.cudagraph.padding import pad_many, padded_size
from vgc.integrations import alibi, attention_probe
from vgc.integrations.decode_loop import DecodeLoop
from vgc.integrations.breakable_generate import breakable, cache_keyword, set_attention
from vgc.integrations.paged_attention import attention, ATTENTION, FlatModel, VgcCache
from vgc.integrations.vision_towers import encoder_manager, vision_adapter
from vgc.ops import flat_batch

try:
    from transformers.modeling_outputs import CausalLMOutputWithPast
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("vgc.integrations.transformers needs transformers: pip install 'vgc[transformers]'") from error

__all__ = ["ATTENTION", "GenerationEngine", "VgcCache", "breakable", "compile", "encoder_manager", "vision_adapter"]

logger = logging.getLogger("vgc")

PATH = "vgc.integrations.transformers.compile"

# The flat batch, and the rows whose logits the call returns (padded: row 0)
PAD_VALUES = {**flat_batch.PAD_VALUES, "logits_indices": 0}
_DYNAMIC = {name: 0 for name in PAD_VALUES}


class GenerationEngine:
    """vgc's state for one Hugging Face causal LM: the paged KV cache, the `vgc.compile` of its flat forward and
    the translation of transformers' calls into flat batches. `compile()` builds it as `model.vgc`."""

    def __init__(self, model: torch.nn.Module, *, max_batch_size: int, max_cache_len: int, block_size: int,
                 config: CompilationConfig | dict | None, tiered: bool = False):
        for name, value in (("max_batch_size", max_batch_size), ("max_cache_len", max_cache_len),
                            ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        text = _text_config(model)
        _check_supported(model, text, max_cache_len)
        self.model = model
        self.max_batch_size, self.max_cache_len, self.block_size = max_batch_size, max_cache_len, block_size
        device, dtype = model.device, model.dtype
        blocks_per_row = math.ceil(max_cache_len / block_size)
        num_blocks = max_batch_size * blocks_per_row
        # Row b owns blocks [b * blocks_per_row, (b + 1) * blocks_per_row): its slots are contiguous, so a token's
        # slot is its row's first slot plus its position.
        self.block_table = torch.arange(num_blocks, dtype=torch.int32, device=device).view(max_batch_size,
                                                                                             blocks_per_row)
        self.row_start = torch.arange(max_batch_size, device=device) * (blocks_per_row * block_size)
        self._offsets = torch.arange(max_batch_size + 1, dtype=torch.int32, device=device)
        self._rows = torch.arange(max_batch_size, device=device)
        self.device = device
        self.kv_caches: list[torch.Tensor] = []
        # Two short sequences through the flat forward, eagerly, before anything large is allocated: every attention
        # layer must be vgc's, and the keys and values it hands over size its cache.
        flat = FlatModel(model, max_cache_len)
        probe = attention_probe.check(model, text, lambda: flat(**self._prefill_example(4)), PATH)
        self.num_layers = len(probe.shapes)
        self.kv_caches = [torch.zeros(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
                          for kv_heads, head_dim in probe.layer_shapes(PATH, model)]
        self.compiled: CompiledModel = vgc_compile(
            flat, config=_config(config, device, max_batch_size),
            dynamic_arg_dims=dict(_DYNAMIC), pad_values=PAD_VALUES, uniform_decode=flat_batch.is_uniform_decode,
            tiered=tiered)
        self._active: weakref.ref | None = None
        self.undo = None   # set by compile(): restores the model when warm-up finds it cannot be served
        self._steps: dict[int, _DecodeStep] = {}   # batch size -> its decode graph's in-place inputs
        self.staged: _DecodeStep | None = None    # whose constant inputs the graph buffers hold now
        # The keyword generate() passes the cache under: `past_key_values` in transformers 5.17, `cache` later.
        self.cache_keyword = cache_keyword(model.forward)
        self.loop = DecodeLoop(self, lambda cache: isinstance(cache, VgcCache) and cache.engine is self and
                               not cache.seen)

    # ---- warm-up ----
    def warmup(self) -> dict[str, Any]:
        """Trace once, compile every piece and capture every CUDA graph, before the first request. generate()
        calls it when it has not run. A tiered start returns at once when nothing is cached: the model itself
        serves until the compiled flat forward is swapped in (`vgc.compile(..., tiered=True)`)."""
        if self._warmup_due():
            trace_size = max(16, *self.compiled.config.compile_sizes) if self.compiled.config.compile_sizes else 16
            try:
                self.compiled.warmup(self._prefill_example, trace_size=trace_size,
                                     make_decode_inputs=self._decode_example)
            except Exception as error:
                cause = _untraceable(error)
                if cause is None:
                    raise
                if self.undo is not None:
                    self.undo()
                raise attention_probe.refused(self.model, PATH, f"vgc cannot trace and split its flat forward as "
                                                                f"one graph ({cause})") from error
        return self.stats()

    def _warmup_due(self) -> bool:
        """Whether warm-up has yet to run (a tiered start's first tier is served until its swap, not warmed up)."""
        return not self.compiled.warmed_up and self.compiled.tier != "eager"

    def _prefill_example(self, n: int) -> dict:
        """n tokens in up to two sequences from position 0 (two at trace time, so no batch dim is 1; with
        max_batch_size 1 both use row 0: warm-up writes are garbage)."""
        lengths = [n] if n < 2 else [n - n // 2, n // 2]
        rows = torch.cat([torch.full((m,), b % self.max_batch_size) for b, m in enumerate(lengths)]).to(self.device)
        table = self.block_table[torch.arange(len(lengths), device=self.device) % self.max_batch_size]
        positions = torch.cat([torch.arange(m) for m in lengths]).to(self.device)
        lens = torch.tensor(lengths, device=self.device)
        offsets = torch.tensor([0, *lengths], device=self.device).cumsum(0).to(torch.int32)
        return self._flat(torch.zeros(n, dtype=torch.long, device=self.device), positions,
                          self.row_start[rows] + positions, table, lens, offsets,
                          offsets[1:].long() - 1)

    def _decode_example(self, n: int) -> dict:
        """n sequences of one token each (rows past max_batch_size share stripes: warm-up writes are garbage)."""
        rows = self._rows[torch.arange(n, device=self.device) % self.max_batch_size]
        zeros = torch.zeros(n, dtype=torch.long, device=self.device)
        return self._flat(zeros, zeros, self.row_start[rows], self.block_table[rows], zeros + 1,
                          torch.arange(n + 1, dtype=torch.int32, device=self.device),
                          torch.arange(n, device=self.device))

    def _flat(self, input_ids, positions, slot_mapping, block_table, seq_lens, query_start_loc, logits_indices):
        return {"input_ids": input_ids, "positions": positions, "kv_caches": self.kv_caches,
                "slot_mapping": slot_mapping, "block_table": block_table, "seq_lens": seq_lens,
                "query_start_loc": query_start_loc, "logits_indices": logits_indices}

    # ---- one call ----
    def check_fits(self, tokens: int) -> None:
        if tokens > self.max_cache_len:
            raise ValueError(f"the sequences would reach {tokens} tokens, more than max_cache_len="
                             f"{self.max_cache_len}; pass a larger max_cache_len to "
                             "vgc.integrations.transformers.compile (or fewer max_new_tokens)")

    def run(self, cache: VgcCache, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
            logits_to_keep) -> torch.Tensor:
        """transformers' call on `cache` -> logits [batch, columns kept, vocab]."""
        if self._active is None or self._active() is not cache:
            if cache.seen:
                raise RuntimeError("this VgcCache's sequences were overwritten: another generate() ran on the model "
                                   "since (vgc's paged cache serves one batch at a time)")
            self._active = weakref.ref(cache)
        if self._warmup_due():
            self.warmup()
        batch, columns = input_ids.shape
        if cache.lens is None:
            if batch > self.max_batch_size:
                raise ValueError(f"a batch of {batch} sequences is more than max_batch_size={self.max_batch_size}; "
                                 "pass a larger max_batch_size to vgc.integrations.transformers.compile")
            cache.batch, cache.lens = batch, torch.zeros(batch, dtype=torch.long, device=self.device)
        elif batch != cache.batch:
            raise ValueError(f"this cache holds {cache.batch} sequences, and the call has {batch}")
        self.check_fits(cache.seen + columns)
        if attention_mask is not None and attention_mask.shape[1] != cache.seen + columns:
            # the mask covers every column the sequences have; anything else is a call that does not continue
            # this cache (generate() without a cache re-sends the whole sequence): appending it would be wrong
            raise RuntimeError(f"a call of {columns} new columns with a mask of {attention_mask.shape[1]} does not "
                               f"continue this VgcCache ({cache.seen} columns seen); generate() must run with "
                               "use_cache=True on vgc's cache")
        new = None if attention_mask is None else attention_mask[:, -columns:]
        keep_all = not (isinstance(logits_to_keep, int) and logits_to_keep == 1) and columns > 1
        if columns == 1 and not keep_all:
            logits = self._decode(cache, input_ids.view(batch), new)
        else:
            logits = self._prefill(cache, input_ids, new, keep_all)
        cache.seen += columns
        if keep_all and isinstance(logits_to_keep, int) and logits_to_keep > 1:
            logits = logits[:, -logits_to_keep:]
        return logits

    def _decode(self, cache: VgcCache, ids: torch.Tensor, new: torch.Tensor | None) -> torch.Tensor:
        """One token per row, all on the device (the token-id check reads two numbers back). A token whose mask
        is 0 still runs, but its row's length does not grow, so its K/V are never read (the next real token
        overwrites them)."""
        batch, positions = cache.batch, cache.lens
        lens = positions + (1 if new is None else new.view(batch))
        step = self.graph_step(batch)
        if step is not None:
            logits = step.run(ids, positions, lens)
        else:
            self.staged = None
            logits = self.compiled(**self._decode_inputs(ids, positions, lens))
        cache.lens = lens   # only once the step ran: a refused call leaves the cache as it was
        return logits[:batch].unsqueeze(1)

    def _decode_inputs(self, ids: torch.Tensor, positions: torch.Tensor, lens: torch.Tensor) -> dict:
        batch = ids.shape[0]
        return self._flat(ids, positions, self.row_start[:batch] + positions, self.block_table[:batch], lens,
                          self._offsets[:batch + 1], self._rows[:batch])

    def graph_step(self, batch: int) -> "_DecodeStep | None":
        """The FULL graph that serves a decode step of `batch` rows, its inputs written in place: the engine
        builds every input itself, so the compiled model's per-call binding, checks and padding copies are
        skipped (what they check holds by construction here; token ids are still checked)."""
        graphs = self.compiled.graphs
        if graphs is None:
            return None
        step = self._steps.get(batch)
        if step is None:
            padded = padded_size(batch, graphs.capture_sizes)
            buffers = None if padded is None else graphs.full_graph_inputs(padded)
            if buffers is None:
                return None
            step = self._steps[batch] = _DecodeStep(self, graphs, batch, padded, buffers)
        return step

    def _prefill(self, cache: VgcCache, input_ids: torch.Tensor, new: torch.Tensor | None,
                 keep_all: bool) -> torch.Tensor:
        """The real tokens of each row (mask 1), appended to the row; one host sync (the token count)."""
        self.staged = None   # the compiled model pads this call into the buffers the decode graphs read
        batch, columns = input_ids.shape
        real = torch.ones_like(input_ids, dtype=torch.bool) if new is None else new.bool()
        positions = cache.lens[:, None] + real.cumsum(1) - 1
        rows = self._rows[:batch, None].expand(batch, columns)
        counts = real.sum(1)
        flat_positions = positions[real]
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
        lens = cache.lens + counts
        logits_indices = torch.arange(flat_positions.shape[0], device=self.device) if keep_all else \
            (offsets[1:].long() - 1).clamp(min=0)
        logits = self.compiled(**self._flat(input_ids[real], flat_positions,
                                            self.row_start[rows[real]] + flat_positions, self.block_table[:batch],
                                            lens, offsets, logits_indices))
        cache.lens = lens
        if not keep_all:
            return logits[:batch].unsqueeze(1)
        out = logits.new_zeros(batch, columns, logits.shape[-1])
        out[real] = logits[:flat_positions.shape[0]]
        return out

    def stats(self) -> dict[str, Any]:
        report = self.compiled.stats()
        report["kv_cache"] = {"max_batch_size": self.max_batch_size, "max_cache_len": self.max_cache_len,
                              "block_size": self.block_size,
                              "bytes": sum(t.numel() * t.element_size() for t in self.kv_caches)}
        report["decode_loop"] = self.loop.stats()
        return report


class _DecodeStep:
    """A decode step of `batch` rows on the FULL graph of capture size `padded`, its inputs written straight
    into the graph's buffers. The first step (and the first after any other call padded its own inputs into
    the same buffers) writes every input with its padding, as the compiled model pads a call; later steps write
    only what changes from step to step: token ids, positions, lengths and slots."""

    def __init__(self, engine: GenerationEngine, graphs, batch: int, padded: int, buffers: dict[str, torch.Tensor]):
        self.engine, self.graphs, self.batch, self.padded, self.buffers = engine, graphs, batch, padded, buffers
        self.id_check = graphs.id_check
        self.moving = [buffers[name][:batch] for name in ("input_ids", "positions", "seq_lens")]
        self.slots = buffers["slot_mapping"][:batch]

    def run(self, ids: torch.Tensor, positions: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        # the ids travel to the host while the graph replays (its lookups clamp them); a refused step's logits
        # are not returned, and the cache's lengths do not grow
        end_check = self.id_check.begin({"input_ids": ids}) if self.id_check is not None else None
        engine = self.engine
        if engine.staged is not self:
            self.stage(ids, positions, lens)
        else:
            _compat.copy_many(self.moving, [ids, positions, lens])
            torch.add(engine.row_start[:self.batch], positions, out=self.slots)
        logits = self.graphs.replay_full(self.padded)
        if end_check is not None:
            end_check()
        return logits

    def stage(self, ids: torch.Tensor, positions: torch.Tensor, lens: torch.Tensor) -> None:
        """Write every input of this step, padding included, into the graph's buffers."""
        inputs = self.engine._decode_inputs(ids, positions, lens)
        pad_many([(buffer, inputs[name], _DYNAMIC[name], PAD_VALUES[name])
                  for name, buffer in self.buffers.items()], self.padded - self.batch)
        self.engine.staged = self


def compile(model: torch.nn.Module, *, max_batch_size: int = 8, max_cache_len: int | None = None,
            block_size: int = 16, config: CompilationConfig | dict | None = None,
            device_loop: bool = True, tiered: bool = False) -> torch.nn.Module:
    """Prepare a transformers causal LM for fast `generate()` and return it (changed in place; `model.vgc` is
    its `GenerationEngine`).

    `max_batch_size` sequences of `max_cache_len` tokens each (default: the model's `max_position_embeddings`,
    at most 4096) fit the paged KV cache, allocated now. `config` is a `vgc.CompilationConfig` (or a dict of its
    fields) for the flat forward; by default, on CUDA, FULL CUDA graphs for decode steps of 1 to `max_batch_size`
    sequences and piece graphs for prefill of up to that many tokens.

    `device_loop`: generate()'s greedy and sampling loop runs on the device (`vgc.integrations.decode_loop`): per
    token the decode step's FULL graph and a sampler graph replay, and the host reads whether every row is done
    only every few tokens. Calls it does not reproduce run transformers' loop (`stats()["decode_loop"]`).

    `tiered`: the first generate() of a process whose cache holds no compiled model starts at once, on the model
    itself over vgc's cache, while a child process compiles; a later step swaps the compiled model in (its
    KV cache kept), and its decode graphs serve from then on (`model.vgc.stats()["tier"]`).

    generate() calls that bring their own cache of another kind (`past_key_values=DynamicCache()`), and forward
    calls without a cache, run the model eagerly with its original attention.
    """
    if getattr(model, "vgc", None) is not None:
        raise ValueError("this model was already prepared by vgc.integrations.transformers.compile")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{type(model).__name__} is an encoder-decoder model; vgc.integrations.transformers "
                         "serves decoder-only causal LMs")
    if max_cache_len is None:
        max_cache_len = min(getattr(_text_config(model), "max_position_embeddings", None) or 4096, 4096)
    original_attention = model.config._attn_implementation
    own = {name: model.__dict__[name] for name in ("forward", "generate") if name in model.__dict__}
    undo_alibi = alibi.install(model, attention)

    def undo() -> None:
        """Leave the model as it was before compile (a refusal, here or at warm-up)."""
        for name in ("forward", "generate"):
            if name in own:
                setattr(model, name, own[name])
            else:
                model.__dict__.pop(name, None)
        model.__dict__.pop("vgc", None)
        model.__dict__.pop(model_copy.PROCESS_LOCAL, None)
        set_attention(model, original_attention)
        if undo_alibi is not None:
            undo_alibi()

    serving = ATTENTION if undo_alibi is None else alibi.ATTENTION
    set_attention(model, serving)
    try:
        engine = GenerationEngine(model, max_batch_size=max_batch_size, max_cache_len=max_cache_len,
                                  block_size=block_size, config=config, tiered=tiered)
    except Exception:
        undo()
        raise
    forward, generate = model.forward, model.generate
    cache_name = engine.cache_keyword

    @functools.wraps(forward)
    def vgc_forward(input_ids=None, attention_mask=None, *args, **kwargs):
        cache = kwargs.get(cache_name)
        if not isinstance(cache, VgcCache) or cache.engine is not engine or args or \
                kwargs.get("inputs_embeds") is not None or kwargs.get("output_attentions") or \
                kwargs.get("output_hidden_states") or input_ids is None:
            return _eager(model, forward, original_attention, serving, input_ids, attention_mask, *args, **kwargs)
        logits = engine.run(cache, input_ids, attention_mask, kwargs.get("logits_to_keep", 0))
        return CausalLMOutputWithPast(logits=logits, **{cache_name: cache})

    @functools.wraps(generate)
    def vgc_generate(*args, **kwargs):
        if _serves(cache_name, kwargs):
            beams = kwargs.get("num_beams") or getattr(kwargs.get("generation_config") or model.generation_config,
                                                       "num_beams", 1) or 1
            if beams > 1:
                raise NotImplementedError(f"num_beams={beams}: vgc's paged cache does not reorder rows, so beam "
                                          "search is not supported; use greedy or sampling")
            kwargs[cache_name] = VgcCache(engine)
            kwargs["use_cache"] = True   # else generate() re-sends every column each step (MPT's config says False)
            engine.warmup()
            if device_loop:
                _use_device_loop(engine, generate, args, kwargs)
        return generate(*args, **kwargs)

    engine.undo = undo
    model.forward, model.generate, model.vgc = vgc_forward, vgc_generate, engine
    # this process's: a background compile's copy of the model runs its class's forward, with no engine
    model.__dict__[model_copy.PROCESS_LOCAL] = ("forward", "generate", "vgc")
    return model


# What a generate() call asks that only the model's own cache and forward give: each forward of such a call runs
# eagerly on the original attention (vgc_forward sees no VgcCache), with transformers' own cache.
_OWN_CACHE_KEYWORDS = ("past_key_values", "cache")   # transformers 5.17 takes the first, later ones both
_PER_STEP_OUTPUTS = ("output_hidden_states", "output_attentions")


def _serves(cache_name: str, kwargs: dict) -> bool:
    """Whether vgc's cache serves this generate() call."""
    if any(kwargs.get(name) is not None for name in (cache_name, *_OWN_CACHE_KEYWORDS)):
        return False
    if not kwargs.get("use_cache", True) or kwargs.get("inputs_embeds") is not None:
        return False
    config = kwargs.get("generation_config")
    return not any(kwargs.get(name) or getattr(config, name, False) for name in _PER_STEP_OUTPUTS)


def _use_device_loop(engine: GenerationEngine, generate, args: tuple, kwargs: dict) -> None:
    """Hand generate() vgc's decoding method, unless the call asks for what only transformers' loop does."""
    if "custom_generate" not in inspect.signature(generate).parameters:
        reason = "this transformers has no custom_generate"
    elif len(args) > 1:
        reason = "positional arguments after the inputs"
    else:
        reason = next((why for name, why in (("custom_generate", "a custom_generate of the caller's"),
                                             ("assistant_model", "an assistant model"), ("streamer", "a streamer"),
                                             ("synced_gpus", "synced_gpus"))
                       if kwargs.get(name)), None)
    if reason is None:
        kwargs["custom_generate"] = engine.loop.decode
    else:
        engine.loop.fallback(reason)


def _eager(model, forward, original: str, serving: str, *args, **kwargs):
    """A call vgc does not serve, on the model's original attention: no vgc cache, or inputs it does not take."""
    counters.eager_runs += 1
    set_attention(model, original)
    try:
        return forward(*args, **kwargs)
    finally:
        set_attention(model, serving)


def _config(config: CompilationConfig | dict | None, device: torch.device, max_batch_size: int) -> CompilationConfig:
    """The user's config, else: on CUDA, FULL graphs for decode at 1 .. max_batch_size sequences (1, 2, 4, then
    multiples of 8) and piece graphs for small prefills; the CPU runs the compiled pieces."""
    if isinstance(config, CompilationConfig):
        _refuse_ranges(config.compile_ranges_max_size)
        return config
    options = dict(config or {})
    _refuse_ranges(options.get("compile_ranges_max_size", 0))
    if device.type == "cuda":
        sizes = sorted({s for s in (1, 2, 4) if s < max_batch_size} | set(range(8, max_batch_size, 8)) |
                       {max_batch_size})
        options.setdefault("cudagraph_mode", CUDAGraphMode.FULL_AND_PIECEWISE.value)
        options.setdefault("cudagraph_capture_sizes", sizes)
    return CompilationConfig.from_options(options)


def _refuse_ranges(max_size) -> None:
    # Flat batches of real tokens have no size conditions to split at, and the decode step replays the first
    # range's graphs directly.
    if max_size:
        raise ValueError(f"compile_ranges_max_size={max_size}: the transformers integration runs one trace (its "
                         "flat batches have no size conditions); leave it 0")


def _untraceable(error: BaseException) -> str | None:
    """`Type: first line` of the error in `error`'s chain that says the model cannot be traced (Dynamo's Unsupported)
    or split (a guard on a data-dependent size, such as an MoE's per-expert token counts), else None."""
    kinds = _compat.untraceable_errors()
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, kinds):
            text = str(error).strip()
            return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        error = error.__cause__ or error.__context__
    return None


def _text_config(model: torch.nn.Module):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def _check_supported(model: torch.nn.Module, text, max_cache_len: int) -> None:
    """Refuse, before allocating anything, what vgc's attention would compute differently from the model."""
    name = type(model).__name__
    softcap = getattr(text, "attn_logit_softcapping", None)
    if softcap is not None:
        raise ValueError(f"{name} soft-caps its attention logits (attn_logit_softcapping={softcap}), which "
                         "vgc::attention does not implement; serve it with torch.compile(model.forward, "
                         "backend='vgc') instead")
    if any(isinstance(getattr(module, "sinks", None), torch.Tensor) for module in model.modules()):
        raise ValueError(f"{name} adds attention sinks to its softmax (its attention modules' `sinks`), which "
                         "vgc::attention does not implement; serve it with torch.compile(model.forward, "
                         "backend='vgc') instead")
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    sliding = ("sliding_attention" in layer_types) if layer_types else \
        (window is not None and getattr(text, "use_sliding_window", True))
    if sliding and window is not None and window < max_cache_len:
        raise ValueError(f"{name} has layers that attend over a sliding window of {window} tokens, which "
                         f"vgc::attention does not implement; pass max_cache_len <= {window} (then the window "
                         "never binds)")
    if not hasattr(model, "generate") or "logits_to_keep" not in inspect.signature(type(model).forward).parameters:
        raise ValueError(f"{name} is not a transformers causal LM whose forward takes logits_to_keep; "
                         "vgc.integrations.transformers serves *ForCausalLM decoders")
