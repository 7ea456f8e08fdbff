"""transformers' attention and cache interfaces over vgc's paged KV cache: what a Hugging Face decoder calls inside
`vgc.integrations.transformers`.

`FlatModel` runs the causal LM over one flat batch of tokens (vLLM's layout, `vgc.ops.flat_batch`); the "vgc"
attention function (registered with transformers' `AttentionInterface`) reads that batch and calls
`vgc::attention`, the op vgc splits at; `VgcCache` is the `transformers.Cache` generate() carries between steps:
lengths only, the keys and values living in the paged cache.
"""

from __future__ import annotations

import torch

from vgc.capture import registries
from vgc.integrations import alibi, attention_probe
from vgc.integrations.breakable_generate import refuse_unsupported

try:
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("vgc.integrations.transformers needs transformers: pip install 'vgc[transformers]'") from error

__all__ = ["ATTENTION", "attention", "FlatModel", "VgcCache"]

ATTENTION = "vgc"   # the attn_implementation name vgc registers with transformers
_BATCH = "vgc_batch"   # the keyword under which the flat batch travels through the model to the attention function


class _Running:
    """The flat batch of the forward running now, for models whose layers drop the keyword arguments on the way to
    the attention function (StableLM, Falcon). Set and cleared by `FlatModel.forward`; under Dynamo both are
    traced side effects, so a compiled call ends with it cleared too."""
    batch: dict | None = None


_RUNNING = _Running()


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
              sliding_window=None, s_aux=None, **kwargs):
    """transformers' attention interface over vgc's paged cache: query [1, H, N, D], key/value [1, Hkv, N, D] are
    the flat batch's new tokens; returns [1, N, H, D]. `attention_mask` is None (no mask function is registered
    for "vgc"): the lengths in the flat batch say what each token sees."""
    batch = kwargs.get(_BATCH)
    if batch is None:
        batch = _RUNNING.batch
    # ALiBi families' bias is in their slopes (vgc/integrations/alibi.py); the mask their forward built is not read
    slopes = getattr(module, alibi.SLOPES, None)
    probed = attention_probe.record(module, batch is not None, None if slopes is not None else attention_mask,
                                    query, key, value)
    if probed is not None:
        return probed, None
    if batch is None:
        raise RuntimeError("attn_implementation='vgc' runs only inside a model prepared by "
                           "vgc.integrations.transformers.compile(model); call that model's generate() or forward")
    refuse_unsupported(module, softcap, s_aux, "vgc::attention",
                       "serve this model with torch.compile(model.forward, backend='vgc') instead")
    if sliding_window is not None and sliding_window < batch["max_len"]:
        raise ValueError(f"{type(module).__name__} attends over a sliding window of {sliding_window} tokens, which "
                         f"vgc::attention does not implement; pass max_cache_len <= {sliding_window} (then the "
                         "window never binds)")
    kv = batch["kv_caches"][module.layer_idx]
    q, k = (t[0].transpose(0, 1).contiguous() for t in (query, key))
    # The values stay where the projection wrote them: a slice of the fused qkv output, rows wider than the
    # values (in a decode graph its copy was one more kernel per layer, outside the chain of PDL launches).
    # vgc::attention reads every row and head by its stride, as for vgc's own Llama; it needs the head dim whole.
    v = value[0].transpose(0, 1)
    if v.stride(-1) != 1:
        v = v.contiguous()
    out = q.new_empty(q.shape)
    torch.ops.vgc.attention(out, q, k, v, kv[0], kv[1], batch["slot_mapping"], batch["block_table"],
                            batch["seq_lens"], batch["query_start_loc"],
                            module.head_dim ** -0.5 if scaling is None else scaling, slopes)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTENTION, attention)
AttentionInterface.register(alibi.ATTENTION, attention)


class FlatModel(torch.nn.Module):
    """The Hugging Face causal LM over one flat batch of tokens (vLLM's layout): what `vgc.compile` traces.

    Returns the logits of the tokens at `logits_indices` ([len(logits_indices), vocab])."""

    def __init__(self, model: torch.nn.Module, max_len: int):
        super().__init__()
        self.model = model
        self.max_len = max_len
        # The class's forward: the instance's `forward` attribute is vgc's wrapper, which calls this module.
        self.causal_lm_forward = type(model).forward

    def __setstate__(self, state):
        """A copy for another process (a tiered start's compile, `vgc.capture.model_copy`) is made without
        `__init__`, its Hugging Face model's too; building a model records what outputs its class can capture
        (transformers' `_CAN_RECORD_REGISTRY`), and the forward reads that record. Without it there, the copy's
        trace would follow a class with none, and Dynamo's guard on the record (torch 2.11) refuses the trace in
        every process that built the model."""
        super().__setstate__(state)
        _record_built_classes(self.model)

    def forward(self, input_ids, positions, kv_caches, slot_mapping, block_table, seq_lens, query_start_loc,
                logits_indices):
        batch = {"kv_caches": kv_caches, "slot_mapping": slot_mapping, "block_table": block_table,
                 "seq_lens": seq_lens, "query_start_loc": query_start_loc, "max_len": self.max_len}
        _RUNNING.batch = batch
        try:
            out = self.causal_lm_forward(self.model, input_ids=input_ids.unsqueeze(0),
                                         position_ids=positions.unsqueeze(0), use_cache=False,
                                         logits_to_keep=logits_indices, **{_BATCH: batch})
        finally:
            _RUNNING.batch = None
        return out.logits[0]


def _record_built_classes(model: torch.nn.Module) -> None:
    """What `PreTrainedModel.__init__` records per class (transformers' private registry of `_can_record_outputs`,
    keyed by the class's name: a dict in 5.17, a dict subclass later), for each Hugging Face model in `model` whose
    class has no record yet. Dynamo's saved guard state unpickles this class too, with the submodules it does not
    guard left as placeholders: the walk (`registries.submodules`) takes only modules."""
    try:
        from transformers import PreTrainedModel
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:   # a transformers without the registry: nothing is recorded at build either
        return
    for module in registries.submodules(model):
        if isinstance(module, PreTrainedModel) and str(type(module)) not in _CAN_RECORD_REGISTRY:
            dict.__setitem__(_CAN_RECORD_REGISTRY, str(type(module)), getattr(module, "_can_record_outputs", None))


class VgcCache(Cache):
    """What generate() carries between steps: how many columns the batch has seen, and each row's length (its
    real tokens, on the device). The keys and values live in the engine's paged cache, which serves one
    `VgcCache` at a time: the one most recently started."""

    def __init__(self, engine):   # the `vgc.integrations.transformers.GenerationEngine` whose paged cache it uses
        super().__init__(layers=[])
        self.engine = engine
        self.seen = 0          # columns of the batch processed so far (transformers' "sequence length")
        self.batch = 0
        self.lens: torch.Tensor | None = None   # [batch] int64: real tokens per row, in the paged cache

    # transformers asks these of any cache.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:   # unused: "vgc" has no mask function
        query_length = args[0] if args else kwargs.get("query_length", 0)
        length = query_length.shape[0] if isinstance(query_length, torch.Tensor) else int(query_length)
        return self.seen + length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.engine.max_cache_len

    def __len__(self) -> int:
        return self.engine.num_layers

    @property
    def is_compileable(self) -> bool:   # vgc compiles the forward itself; generate() must not wrap it again
        return False

    @property
    def is_initialized(self) -> bool:
        return self.lens is not None

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * self.engine.num_layers

    @property
    def is_linear(self) -> list[bool]:
        return [False] * self.engine.num_layers

    @property
    def is_dummy(self) -> list[bool]:
        return [False] * self.engine.num_layers

    @property
    def batch_size(self) -> int:
        return self.batch

    @property
    def max_batch_size(self) -> int:
        return self.engine.max_batch_size

    @property
    def max_cache_len(self) -> int:
        return self.engine.max_cache_len

    def reset(self) -> None:
        self.seen, self.batch, self.lens = 0, 0, None

    def update(self, *args, **kwargs):
        raise RuntimeError("VgcCache holds no per-layer tensors: vgc's attention writes its paged cache; run the "
                           "model prepared by vgc.integrations.transformers.compile, with attn_implementation='vgc'")

    def _unsupported(self, what: str):
        raise NotImplementedError(f"vgc's paged cache does not support {what} (beam search, assisted or "
                                  "contrastive decoding): use greedy or sampling, or the model without vgc")

    def reorder_cache(self, *args, **kwargs):
        self._unsupported("reordering rows")

    def crop(self, *args, **kwargs):
        self._unsupported("cropping")

    def batch_repeat_interleave(self, *args, **kwargs):
        self._unsupported("repeating rows")

    def batch_select_indices(self, *args, **kwargs):
        self._unsupported("selecting rows")
