"""ALiBi families (Bloom, MPT, Falcon with `alibi=True`) on vgc's paged attention.

These models carry position as a linear bias on the attention scores, one slope per head (ALiBi), which each
family folds into a tensor of its own: Bloom's and MPT's attention modules compute attention themselves with it,
and Falcon adds it to the mask it hands transformers' attention interface. vgc's attention takes the slopes
instead (`vgc::attention`'s `alibi_slopes`: slope * (key position - query position), per sequence, whatever the
batch layout), so a prepared model gets:

- the slopes, computed by the family's own helper and scaled as the family scales its bias, as a buffer
  `vgc_alibi_slopes` on each attention module;
- for Bloom and MPT, whose modules never call the attention interface, a forward that computes the module's
  query, key and value as the module does, hands them to the registered attention function, and projects the
  result as the module does; it runs the module's own forward whenever the model is not switched to vgc's
  attention (the integration's eager fallback);
- the attention implementation `ATTENTION`, whose mask function materialises the mask these families' forwards
  read (MPT and Falcon fail on none); vgc's attention ignores that mask, whose bias the slopes stand for.

`install` knows each family's layout by its attention class; another ALiBi model is not installed (the probe then
refuses it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

try:
    from transformers import AttentionMaskInterface
    from transformers.masking_utils import eager_mask
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("vgc.integrations.transformers needs transformers: pip install 'vgc[transformers]'") from error

ATTENTION = "vgc_alibi"
SLOPES = "vgc_alibi_slopes"

AttentionMaskInterface.register(ATTENTION, eager_mask)


def install(model: torch.nn.Module, attention: Callable) -> Callable[[], None] | None:
    """Prepare an ALiBi model's attention modules for `attention` (the registered function); returns the undo, or
    None (nothing changed) for a model that is not one of the ALiBi families vgc knows."""
    config = model.config
    kind = type(model).__name__
    if kind.startswith("Bloom"):
        modules, forward = _modules(model, "BloomAttention"), _bloom_forward
        slopes = _bloom_slopes(config.n_head)
    elif kind.startswith("Mpt"):
        modules, forward = _modules(model, "MptAttention"), _mpt_forward
        slopes = _mpt_slopes(config.n_heads, config.attn_config.alibi_bias_max)
    elif kind.startswith("Falcon") and getattr(config, "alibi", False):
        # Falcon divides its bias by sqrt(head size) before adding it to the scores
        from transformers.models.falcon.modeling_falcon import build_alibi_tensor
        modules, forward = _modules(model, "FalconAttention"), None
        slopes = _bloom_slopes(config.num_attention_heads, build_alibi_tensor) / math.sqrt(
            config.hidden_size // config.num_attention_heads)
    else:
        return None
    if not modules:
        return None
    device = next(model.parameters()).device
    for module in modules:
        module.register_buffer(SLOPES, slopes.to(device), persistent=False)
        if forward is not None:
            module.forward = _switched(module, config, forward, attention)

    def undo() -> None:
        for module in modules:
            delattr(module, SLOPES)
            module.__dict__.pop("forward", None)

    return undo


def _modules(model: torch.nn.Module, class_name: str) -> list[torch.nn.Module]:
    return [module for module in model.modules() if type(module).__name__ == class_name]


def _switched(module, config, forward, attention):
    """`forward` while the model runs vgc's ALiBi attention, the module's own otherwise."""
    own = type(module).forward.__get__(module)

    def call(*args, **kwargs):
        if config._attn_implementation != ATTENTION:
            return own(*args, **kwargs)
        return forward(module, attention, *args, **kwargs)

    return call


def _bloom_slopes(num_heads: int, build=None) -> torch.Tensor:
    """Bloom's (and Falcon's) slopes, from the family's own bias builder: the bias of position 1 is the slope."""
    if build is None:
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor as build
    return build(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)[:, 0, 1].clone()


def _mpt_slopes(num_heads: int, bias_max: float) -> torch.Tensor:
    """MPT's slopes, from its own bias builder: the bias of the key one position back is minus the slope."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
    return -build_mpt_alibi_tensor(num_heads, 2, bias_max)[:, 0, 0].float()


def _bloom_forward(module, attention, hidden_states, residual, *args, **kwargs):
    batch, length = hidden_states.shape[:2]
    query, key, value = module._reshape(module.query_key_value(hidden_states))   # [batch, heads, tokens, dim] each
    out, _ = attention(module, query, key, value, None, scaling=module.inv_norm_factor)
    context = out.reshape(batch, length, -1)
    if module.pretraining_tp > 1 and module.slow_but_exact:   # the dense projection in slices, as Bloom sums it
        width = module.hidden_size / module.pretraining_tp
        output = torch.zeros_like(context)
        for i in range(module.pretraining_tp):
            cut = slice(int(i * width), int((i + 1) * width))
            output = output + torch.nn.functional.linear(context[:, :, cut], module.dense.weight[:, cut])
    else:
        output = module.dense(context)
    return residual + torch.nn.functional.dropout(output, module.hidden_dropout, module.training), None


def _mpt_forward(module, attention, hidden_states, *args, **kwargs):
    batch, length = hidden_states.shape[:2]
    qkv = module.Wqkv(hidden_states)
    if module.clip_qkv:
        qkv = qkv.clamp(min=-module.clip_qkv, max=module.clip_qkv)
    query, key, value = (t.reshape(batch, length, module.n_heads, module.head_dim).transpose(1, 2)
                         for t in qkv.chunk(3, dim=2))
    out, _ = attention(module, query, key, value, None, scaling=module.softmax_scale)
    return module.out_proj(out.reshape(batch, length, -1)), None
