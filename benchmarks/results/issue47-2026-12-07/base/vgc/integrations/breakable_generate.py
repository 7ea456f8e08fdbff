"""CUDA graphs for an unmodified transformers causal LM under `generate()`, on its default `DynamicCache`, with no
Dynamo and no Inductor (`vgc.integrations.transformers.breakable`).

    from vgc.integrations import transformers as vgc_transformers
    model = vgc_transformers.breakable(model, batch_sizes=[1, 4])   # captures now, one warm-up generate() a size
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=128)

A decode step replays one breakable capture (`vgc.cudagraph.breakable`) of the model's own forward for its batch
size, whatever the KV length: the segments between attention calls are graphs, and two breaks per layer run
eagerly at every replay on this step's objects:
- the cache's `update` (a method break): it grows this generate()'s `DynamicCache`, handed over per call;
- the attention, `vgc::causal_attention`: vgc registers it with transformers' `AttentionInterface` (as
  "vgc_breakable") and switches the model to it. With no mask function registered under that name, transformers
  builds no mask in the forward (that would read the cache's length and the padding mask in a segment); the op
  builds the causal and padding mask itself, from this step's shapes and generate()'s 2-D attention mask, which
  travels to it as a keyword argument (at a decode step, as the additive bias the router makes once per step).

Prefill, and steps of batch sizes not captured, run the same forward eagerly. Sampling, stopping and the rest stay
generate()'s own.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import time
from typing import Any

import torch

from vgc.cudagraph.breakable_capture import BreakableGraphs, DEFAULT_BREAKS
from vgc.integrations import attention_probe
from vgc.ops import causal_attention
from vgc.ops.causal_attention import padding_bias

try:
    from transformers import AttentionInterface
    from transformers.cache_utils import DynamicCache
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("vgc.integrations.transformers needs transformers: pip install 'vgc[transformers]'") from error

logger = logging.getLogger("vgc")

ATTENTION = "vgc_breakable"
PADDING_MASK = "vgc_padding_mask"   # the keyword under which generate()'s 2-D mask travels to the attention


class _Running:
    """The mask of the call the router is running, for models whose layers drop the keyword arguments on the way to
    the attention function (StableLM, Falcon). The same tensor as the call's PADDING_MASK argument, so a capture
    hands the attention break each replay's own mask either way."""
    routed = False
    mask: torch.Tensor | None = None

    def clear(self) -> None:
        self.routed, self.mask = False, None


_RUNNING = _Running()
_DUMMY_PROMPT = 4                   # tokens of each warm-up generate()'s prompt


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
              sliding_window=None, s_aux=None, **kwargs):
    """transformers' attention interface: [batch, heads, q, dim] queries against the cache's keys and values."""
    routed = PADDING_MASK in kwargs or _RUNNING.routed
    mask = kwargs[PADDING_MASK] if PADDING_MASK in kwargs else _RUNNING.mask
    probed = attention_probe.record(module, routed, attention_mask, query, key, value)
    if probed is not None:
        return probed, None
    refuse_unsupported(module, softcap, s_aux, "vgc::causal_attention",
                       "serve this model eagerly or with torch.compile")
    if dropout:
        raise ValueError("vgc_breakable attention serves inference only (dropout must be 0: call model.eval())")
    if attention_mask is not None:
        raise ValueError("vgc_breakable attention builds its own mask; a prepared 4-D attention_mask is not "
                         "supported (pass generate()'s 2-D mask)")
    if not routed:
        # transformers built no mask for this attention: without the router's padding mask a padded row would
        # attend to its padding, a wrong answer
        raise RuntimeError("attn_implementation='vgc_breakable' runs only through the forward of a model prepared by "
                           "vgc.integrations.transformers.breakable (it brings the padding mask). Was this model "
                           "built from the same config object as the prepared one? Give each model its own config, "
                           "or call the prepared model itself")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return torch.ops.vgc.causal_attention(query, key, value, mask, scale, sliding_window), None


AttentionInterface.register(ATTENTION, attention)


def refuse_unsupported(module, softcap, s_aux, op: str, fix: str) -> None:
    """Raise for what transformers asks of an attention that vgc's attention ops do not compute (soft-capped
    logits, attention sinks), rather than leave it out of the answer."""
    if softcap is not None or s_aux is not None:
        what = f"soft-caps its attention logits (softcap={softcap})" if softcap is not None else \
            "adds attention sinks to its softmax (s_aux)"
        raise ValueError(f"{type(module).__name__} {what}, which {op} does not implement; {fix}")


def set_attention(model: torch.nn.Module, name: str) -> None:
    """Switch the model, and its sub-models' configs (a VLM's text model), to the attention implementation `name`."""
    for config in {id(c): c for c in _configs(model.config)}.values():
        config._attn_implementation = name


def _configs(config):
    yield config
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            yield from _configs(sub)


class BreakableDecode:
    """`model.vgc_breakable`: routes the model's forward (decode steps to their graphs, the rest eagerly) and holds
    the graphs. Made by `breakable()`."""

    def __init__(self, model: torch.nn.Module, batch_sizes: list[int], breaks=None):
        self.model = model
        self.forward = model.forward   # the model's own, bound
        self.dtype = model.dtype          # the attention's queries'
        self._signature = inspect.signature(self.forward)
        parameters = self._signature.parameters
        self._var_keyword = next((name for name, p in parameters.items() if p.kind is p.VAR_KEYWORD), None)
        self.cache_name = cache_keyword(self.forward)
        self.graphs = BreakableGraphs(self.forward, dynamic_arg_dims={"input_ids": 0, "position_ids": 0},
                                      capture_sizes=list(batch_sizes),
                                      breaks=[*DEFAULT_BREAKS, DynamicCache.update, *(breaks or ())])
        self.warming = False
        self._warm: set[int] = set()   # batch sizes whose decode step ran eagerly once in warm-up
        self.eager_calls = 0

    def __call__(self, *args, **kwargs):
        if args:   # generate() passes keywords; a user's own call may not
            kwargs = self._keywords(args, kwargs)
        try:
            return self._route(kwargs)
        finally:
            _RUNNING.clear()

    def _route(self, kwargs: dict):
        mask = kwargs.get("attention_mask")
        batch = self._decode_batch(kwargs)
        if batch is None:
            # bool once per call, not once per layer; None (no padding) travels too: it tells the attention that
            # the call came through here
            _hand_mask(kwargs, mask.to(torch.bool) if mask is not None else None)
            return self._eager(**kwargs)
        if mask is None:   # every step of every capture hands the op a mask, so one capture serves with or without
            mask = torch.ones(batch, kwargs[self.cache_name].get_seq_length() + 1, dtype=torch.bool,
                              device=kwargs["input_ids"].device)
        # the additive bias, once per step for every layer
        _hand_mask(kwargs, padding_bias(mask, self.dtype))
        # The op reads the mask under PADDING_MASK; the forward itself gets none. Some transformers versions look at
        # a given mask's shape before finding that the attention needs no prepared mask: a read inside a segment,
        # which would tie every replay to the captured mask (one token longer each step, so none would replay).
        kwargs["attention_mask"] = None
        if kwargs["position_ids"].shape[0] != batch:   # [1, 1] when generate() had no mask: the same positions
            kwargs["position_ids"] = kwargs["position_ids"].expand(batch, -1)
        if batch in self.graphs.graphs:
            return self.graphs(**kwargs)
        if self.warming and batch in self.graphs.capture_sizes:
            if batch not in self._warm:   # the step's kernels run once outside any capture first (lazy set-up)
                self._warm.add(batch)
                return self._eager(**kwargs)
            return self.graphs.capture(**kwargs)
        return self._eager(**kwargs)

    def _keywords(self, args: tuple, kwargs: dict) -> dict:
        bound = self._signature.bind(*args, **kwargs)
        keywords = dict(bound.arguments)
        keywords.update(keywords.pop(self._var_keyword, None) or {})
        return keywords

    def _decode_batch(self, kwargs: dict) -> int | None:
        """The batch size of a decode step vgc serves (one new token per row, generate()'s DynamicCache holding
        earlier tokens, positions given), else None."""
        ids, cache, positions = kwargs.get("input_ids"), kwargs.get(self.cache_name), kwargs.get("position_ids")
        if ids is None or ids.dim() != 2 or ids.shape[1] != 1 or type(cache) is not DynamicCache or \
                positions is None or positions.dim() != 2 or positions.shape[1] != 1 or \
                kwargs.get("inputs_embeds") is not None or kwargs.get("output_attentions") or \
                kwargs.get("output_hidden_states") or not cache.get_seq_length():
            return None
        return ids.shape[0]

    def _eager(self, *args, **kwargs):
        self.eager_calls += 1
        return self.forward(*args, **kwargs)

    def warmup(self) -> dict[str, Any]:
        """One short greedy generate() per batch size, largest first: its first decode step runs eagerly (warm-up),
        its second is captured with the keyword arguments generate() really passes, so later steps match it."""
        start = time.perf_counter()
        device = next(self.model.parameters()).device
        # the model's own generation settings (what its forward is called with), but three greedy tokens, always:
        # generate() fills a passed config's unset fields from the model's, so the model's EOS is lifted meanwhile
        settings = self.model.generation_config
        config = copy.deepcopy(settings)
        config.update(max_new_tokens=3, min_new_tokens=3, do_sample=False, num_beams=1, pad_token_id=0,
                      eos_token_id=None, stop_strings=None, max_time=None)
        eos, settings.eos_token_id = settings.eos_token_id, None
        self.warming = True
        try:
            for batch in sorted(self.graphs.capture_sizes, reverse=True):
                ids = torch.zeros(batch, _DUMMY_PROMPT, dtype=torch.long, device=device)
                self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        finally:
            self.warming = False
            settings.eos_token_id = eos
        self.eager_calls = 0
        missed = sorted(set(self.graphs.capture_sizes) - set(self.graphs.graphs))
        if missed:
            logger.warning("breakable decode: batch sizes %s were not captured (see the warnings above); their "
                           "decode steps run eagerly", missed)
        logger.info("breakable decode graphs for batch sizes %s in %.2f s", sorted(self.graphs.graphs),
                    time.perf_counter() - start)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """The graphs' `stats()` (model_counters: cudagraph_replays are decode steps replayed, eager_runs the
        steps of a captured batch size that could not replay), and `eager_calls`: prefills and other calls the
        router ran eagerly since warm-up."""
        return {**self.graphs.stats(), "eager_calls": self.eager_calls}


def breakable(model: torch.nn.Module, *, batch_sizes: list[int] = (1,), breaks=None,
              warmup: bool = True) -> torch.nn.Module:
    """Breakable CUDA graphs for `model.generate()`'s decode steps on the default `DynamicCache`: the model
    (changed in place: its attention becomes "vgc_breakable", its forward routes decode steps to the graphs;
    `model.vgc_breakable` holds them). One capture per batch size in `batch_sizes` (a step of another batch size
    runs eagerly), made now by a warm-up generate() each unless `warmup=False` (then call
    `model.vgc_breakable.warmup()` before serving). `breaks`: more breaks, as for `vgc.cudagraph.breakable`."""
    if getattr(model, "vgc_breakable", None) is not None:
        raise ValueError("this model was already prepared by vgc.integrations.transformers.breakable")
    if getattr(model, "vgc", None) is not None:
        raise ValueError("this model was prepared by vgc.integrations.transformers.compile; breakable graphs "
                         "replace that path, so start from the unprepared model")
    if getattr(model.config, "is_encoder_decoder", False) or not hasattr(model, "generate"):
        raise ValueError(f"{type(model).__name__} is not a decoder-only causal LM with generate(); "
                         "vgc.integrations.transformers.breakable serves those")
    sizes = sorted(set(batch_sizes))
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise ValueError(f"batch_sizes must be positive ints, got {list(batch_sizes)}")
    if model.training:
        raise ValueError("breakable graphs serve inference: call model.eval() first")
    original_attention = model.config._attn_implementation
    set_attention(model, ATTENTION)
    try:
        attention_probe.check(model, model.config.get_text_config(), lambda: _probe_forward(model),
                              "vgc.integrations.transformers.breakable")
        decode = BreakableDecode(model, sizes, breaks)
    except ValueError:
        set_attention(model, original_attention)
        raise
    model.forward = functools.wraps(decode.forward)(decode)
    model.vgc_breakable = decode
    if warmup:
        decode.warmup()
    return model


def cache_keyword(forward) -> str:
    """The keyword a causal LM's forward takes its KV cache under: `past_key_values` (transformers 5.17), `cache`
    (later)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _hand_mask(kwargs: dict, mask: torch.Tensor | None) -> None:
    """Give the call's attention its padding mask: as a keyword argument, and beside it for layers that drop those."""
    kwargs[PADDING_MASK] = _RUNNING.mask = mask
    _RUNNING.routed = True


def _probe_forward(model: torch.nn.Module) -> None:
    """A prefill of two rows, one left-padded, the way the router runs one (generate()'s keywords, the 2-D mask
    under PADDING_MASK)."""
    device = next(model.parameters()).device
    ids = torch.ones(2, 3, dtype=torch.long, device=device)
    mask = torch.ones_like(ids)
    mask[1, 0] = 0
    kwargs = {cache_keyword(model.forward): DynamicCache(), "use_cache": True}
    if "position_ids" in inspect.signature(model.forward).parameters:
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    _hand_mask(kwargs, mask.bool())
    try:
        model.forward(input_ids=ids, attention_mask=mask, **kwargs)
    finally:
        _RUNNING.clear()


__all__ = ["ATTENTION", "BreakableDecode", "attention", "breakable", "cache_keyword", "causal_attention",
           "refuse_unsupported",
           "set_attention"]
