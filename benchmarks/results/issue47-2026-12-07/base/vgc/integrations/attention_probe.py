"""Proof, before serving, that a transformers model's attention is vgc's.

Both transformers paths switch the model's attention implementation in its config and replace what the model's own
attention would have read: the cache, the mask (no mask function is registered under vgc's names, so transformers
builds none) and, for the flat path, the batch layout and positions. That is right only if every attention layer
really calls the function registered with transformers' `AttentionInterface`. Families whose attention classes do
their own arithmetic (Bloom, GPT-Neo, MPT, Falcon with ALiBi), whose layers drop the keyword arguments the
function needs (StableLM), or whose forward builds a mask or bias of its own would run half on vgc's attention and
half on their own, without the mask: other tokens, silently.

So a prepared model runs one small forward under a probe, and `check` refuses it unless each of its attention
layers called vgc's function exactly once, with what vgc's path sends and no mask of the model's own.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

# Layer types whose layers attend over the cache as vgc's attention does; any other kind (state-space, linear
# attention, convolutions) keeps state vgc's caches do not hold.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "attention")


@dataclass
class Probe:
    """What the attention functions saw during one probe forward."""
    served: list = field(default_factory=list)     # attention modules called with vgc's batch (in call order)
    unserved: list = field(default_factory=list)   # called without it: the keyword arguments were dropped
    masked: list = field(default_factory=list)     # called with a mask or bias the model built itself
    shapes: dict = field(default_factory=dict)     # id(module) -> (KV heads, key head size, value head size)

    def layer_shapes(self, path: str, model: torch.nn.Module) -> list[tuple[int, int]]:
        """(KV heads, head size) of each layer's cache, by the modules' `layer_idx`: what the model really hands
        its attention, whatever its config calls them."""
        by_layer = {}
        for module in self.served:
            index = getattr(module, "layer_idx", None)
            if not isinstance(index, int) or index in by_layer and by_layer[index][0] is not module:
                raise refused(model, path, f"its attention modules carry no distinct layer_idx ({type(module).__name__}"
                                           f".layer_idx = {index!r}), which says which cache is whose")
            by_layer[index] = (module, self.shapes[id(module)])
        if sorted(by_layer) != list(range(len(by_layer))):
            raise refused(model, path, f"its attention layers' layer_idx values are {sorted(by_layer)}, not 0 .. "
                                       f"{len(by_layer) - 1}")
        shapes = []
        for index in range(len(by_layer)):
            kv_heads, key_size, value_size = by_layer[index][1]
            if key_size != value_size:
                raise refused(model, path, f"layer {index} attends with keys of {key_size} and values of "
                                           f"{value_size} elements per head (multi-head latent attention); vgc's "
                                           "cache holds one size")
            shapes.append((kv_heads, key_size))
        return shapes


_active: Probe | None = None


@contextlib.contextmanager
def probing():
    """Record the attention calls of the forward run inside; yields the `Probe`."""
    global _active
    _active = probe = Probe()
    try:
        yield probe
    finally:
        _active = None


def record(module, served: bool, attention_mask, query: torch.Tensor, key: torch.Tensor,
           value: torch.Tensor) -> torch.Tensor | None:
    """Called by vgc's attention functions first (query, key and value [batch, heads, tokens, head size]). While a
    probe is recording, returns the zeros the caller returns in place of attention ([batch, tokens, heads, head
    size]), so the probe forward reaches every layer and needs no cache; else None."""
    if _active is None:
        return None
    if attention_mask is not None:
        _active.masked.append(module)
    (_active.served if served else _active.unserved).append(module)
    _active.shapes[id(module)] = (key.shape[1], key.shape[-1], value.shape[-1])
    return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3])


def attention_layers(text_config) -> int:
    """The attention layers the model's text config declares; refuses layer types vgc's caches cannot hold."""
    layer_types = getattr(text_config, "layer_types", None) or ()
    others = sorted({kind for kind in layer_types if kind not in ATTENTION_LAYER_TYPES})
    if others:
        raise _Refusal(f"it has layers of type {', '.join(map(repr, others))}, whose state (not keys and values) "
                       "vgc's caches do not hold")
    return text_config.num_hidden_layers


class _Refusal(Exception):
    """A reason the probe found (turned into the ValueError `check` raises)."""


def check(model: torch.nn.Module, text_config, run_forward, path: str) -> Probe:
    """Run `run_forward()` (one small forward of the prepared model) under a probe and raise ValueError, naming
    the model's class, the reason and the path that serves it, unless every attention layer went through vgc's
    attention function exactly once, with vgc's batch and no mask of its own. Returns the probe."""
    try:
        layers = attention_layers(text_config)
        with probing() as probe:
            try:
                with torch.no_grad():
                    run_forward()
            except Exception as error:   # noqa: BLE001 - any failure of the probe forward is a refusal, with its cause
                raise _Refusal(f"its forward fails with vgc's attention ({type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''})") from error
        reason = _reason(probe, layers)
        if reason:
            raise _Refusal(reason)
        return probe
    except _Refusal as refusal:
        raise refused(model, path, str(refusal)) from refusal.__cause__


def refused(model: torch.nn.Module, path: str, reason: str) -> ValueError:
    """The error a transformers path raises for a model it does not serve: the class, why, and what serves it."""
    return ValueError(f"{type(model).__name__} cannot be served by {path}: {reason}. Serve it with "
                      "torch.compile(model.forward, backend='vgc'), which runs the model's own attention (and runs "
                      "what Dynamo cannot trace eagerly)")


def _reason(probe: Probe, layers: int) -> str | None:
    calls = len(probe.served) + len(probe.unserved)
    if probe.masked:
        return (f"{len(probe.masked)} of its attention calls pass a mask or bias the model built itself (ALiBi, a "
                "custom mask), which vgc's attention would ignore")
    if probe.unserved:
        return (f"{len(probe.unserved)} of its {calls} attention calls arrive without the keyword arguments vgc's "
                "attention needs (its layers do not pass **kwargs through to the attention function)")
    modules = {id(module) for module in probe.served}
    if not probe.served:
        return (f"none of its {layers} attention layers calls the function registered with transformers' "
                "AttentionInterface: they compute attention themselves, with their own mask and cache")
    if len(modules) < layers:
        return (f"only {len(modules)} of its {layers} attention layers call the function registered with "
                "transformers' AttentionInterface: the others compute attention themselves, with their own mask and "
                "cache")
    if len(modules) > layers:
        return f"{len(modules)} attention modules called the registered function, for {layers} declared layers"
    if calls != layers:
        return (f"its {layers} attention layers call the registered function {calls} times in one forward (a layer "
                "that attends more than once, as differential attention does, would write its cache twice)")
    return None
