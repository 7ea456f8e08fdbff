"""transformers vision towers as encoder CUDA graphs: one line from a loaded model to an `EncoderCudaGraphManager`.

    manager = vgc.integrations.transformers.encoder_manager(model.visual)      # Qwen2-VL, Qwen2.5-VL
    manager.capture()                                                           # start-up
    per_item = manager.execute({"pixel_values": pixels, "grid_thw": grid_thw})  # what the processor gave

An adapter puts an unmodified tower behind `vgc.encoder.SupportsEncoderCudaGraph`. It reads the tower's modules
and weights in place (nothing is copied or changed) and returns what the tower returns per item:

- `QwenVisionTower` (transformers' `Qwen2VisionTransformerPretrainedModel` and
  `Qwen2_5_VisionTransformerPretrainedModel`): images and videos as the processor packs them (`pixel_values
  [patches, C*T*P*P]`, `grid_thw [items, 3]`), the merged tokens per item. Its graph forward runs the tower's
  own patch embedding, norms, MLPs and merger; attention is `vgc::varlen_attention` over the frames (and, for
  Qwen2.5-VL's window layers, over the windows), with the tower's projections and its 2-D rotary angles.
- `FixedImageTower` (SigLIP and CLIP vision models): images of the tower's fixed size (`pixel_values [images, C,
  H, W]`), `last_hidden_state` per image. Its graph forward is the tower's own forward.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, NamedTuple

import torch
from torch import nn

from vgc import ops  # noqa: F401  (registers torch.ops.vgc.varlen_attention)
from vgc.config import CompilationConfig
from vgc.encoder import (DEFAULT_PATH, edge_fill, EncoderCudaGraphCaptureInputs, EncoderCudaGraphConfig,
                         EncoderCudaGraphManager, EncoderCudaGraphReplayBuffers, EncoderItemSpec, split_by_tokens)
from vgc.models.vit import patch_grid

__all__ = ["QwenVisionTower", "FixedImageTower", "encoder_manager", "vision_adapter"]

QWEN_TOWERS = ("Qwen2VisionTransformerPretrainedModel", "Qwen2_5_VisionTransformerPretrainedModel")
FIXED_TOWERS = ("SiglipVisionModel", "SiglipVisionTransformer", "CLIPVisionModel", "CLIPVisionTransformer")


def vision_adapter(tower: nn.Module, **options) -> Any:
    """The adapter for a transformers vision tower, by its class; `options` go to the adapter."""
    name = type(tower).__name__
    if name in QWEN_TOWERS:
        return QwenVisionTower(tower, **options)
    if name in FIXED_TOWERS:
        return FixedImageTower(tower, **options)
    raise TypeError(f"vgc has no adapter for {name}; it ships adapters for {', '.join(QWEN_TOWERS + FIXED_TOWERS)}. "
                    "Any other encoder can implement vgc.encoder.SupportsEncoderCudaGraph (docs/encoder.md, "
                    "'Your own encoder')")


def encoder_manager(tower: nn.Module, config: CompilationConfig | None = None, *, adapter_options: dict | None = None,
                    **manager_options) -> EncoderCudaGraphManager:
    """An `EncoderCudaGraphManager` for a transformers vision tower (`model.visual`, `model.vision_tower`, ...):
    graphs on by default; call `capture()` at start-up, then `execute(mm_kwargs)` per batch."""
    config = config if config is not None else CompilationConfig(cudagraph_mm_encoder=True)
    return EncoderCudaGraphManager(vision_adapter(tower, **(adapter_options or {})), config, **manager_options)


class _TowerAdapter:
    """Where the tower's weights are: the manager takes the encoder's device and dtype from here."""

    tower: nn.Module

    @property
    def device(self) -> torch.device:
        return next(self.tower.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.tower.parameters()).dtype


class QwenVisionTower(_TowerAdapter):
    """`SupportsEncoderCudaGraph` for the Qwen2-VL and Qwen2.5-VL vision towers of transformers.

    `max_frame_pixels`: the largest frame (image, video frame) a graph serves; the attention kernel is captured
    for it, and an item with a larger frame runs eagerly (`EncoderItemSpec.eager_reason`). `min_pixels`: the
    processor's smallest image (the smallest item in tokens). `max_batch_tokens`: the largest budget.
    """

    def __init__(self, tower: nn.Module, *, max_frame_pixels: int = 1344 * 1344, min_pixels: int = 56 * 56,
                 max_batch_tokens: int = 16384, max_frames_per_video: int = 16):
        cfg = tower.config
        self.tower = tower
        self.patch, self.merge = cfg.patch_size, cfg.spatial_merge_size
        self.unit = self.merge ** 2                                # patches per output token
        self.patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
        attention = tower.blocks[0].attn
        self.heads = attention.num_heads
        self.scale = getattr(attention, "scaling", None) or (attention.qkv.in_features // self.heads) ** -0.5
        self.full_layers = set(getattr(tower, "fullatt_block_indexes", None) or range(len(tower.blocks)))
        self.windowed = len(self.full_layers) < len(tower.blocks)
        # window side in output tokens (Qwen2.5-VL: 112 px / 14 px / merge 2 = 4)
        self.window = cfg.window_size // self.merge // self.patch if self.windowed else 0
        self.max_frame_patches = max(self.unit, max_frame_pixels // self.patch ** 2)
        self.max_window_patches = (self.window ** 2 * self.unit) if self.windowed else 0
        self.min_tokens = max(1, min_pixels // (self.patch * self.merge) ** 2)
        self.max_batch_tokens = max_batch_tokens
        self.max_frames_per_video = max_frames_per_video
        self.out_hidden = tower.merger.mlp[-1].out_features

    # ---- the forward over fixed-shape buffers ----
    def encoder_cudagraph_forward(self, inputs: dict[str, torch.Tensor], path: str = DEFAULT_PATH,
                                  max_seqlen: int | None = None) -> torch.Tensor:
        tower = self.tower
        # [tokens, merge^2, ...] buffers as [patches, ...]: the token count stays the one size, patches exactly 4x
        # it, so the merger's regrouping of 4 patches per token needs no condition on the size
        x = tower.patch_embed(inputs["pixel_values"].flatten(0, 1))            # [patches, dim]
        inv_freq = tower.rotary_pos_emb.inv_freq.float()
        positions = inputs["positions"].flatten(0, 1)                           # [patches, 2]: row, column
        angles = torch.cat([positions[:, :1] * inv_freq, positions[:, 1:] * inv_freq], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]               # [patches, 1, head_dim]
        cos, sin = angles.cos(), angles.sin()
        frame = max_seqlen or self.max_frame_patches
        for index, block in enumerate(tower.blocks):
            if index in self.full_layers:
                cu, longest = inputs["cu_seqlens"], frame
            else:
                cu, longest = inputs["cu_window_seqlens"], min(frame, self.max_window_patches)
            x = x + self._attention(block.attn, block.norm1(x), cos, sin, cu, longest)
            x = x + block.mlp(block.norm2(x))
        return tower.merger(x)                                                  # [tokens, out_hidden]

    def _attention(self, attn: nn.Module, x: torch.Tensor, cos, sin, cu_seqlens, max_seqlen: int) -> torch.Tensor:
        q, k, v = attn.qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(1)     # [patches, heads, head_dim]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = torch.ops.vgc.varlen_attention(q, k, v, cu_seqlens, max_seqlen, self.scale)
        return attn.proj(out.flatten(1))

    # ---- buffers ----
    def _inputs(self, mm_kwargs: dict, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The buffers at the batch's own size: patches (in window order for window attention), their rows and
        columns, frame boundaries and window boundaries. With `out` (captured buffers), patches and positions are
        gathered straight into their leading rows: the pixels' one copy."""
        grids = _grids(mm_kwargs["grid_thw"])
        pixels = mm_kwargs["pixel_values"]
        device = pixels.device
        rows = self._item_rows(mm_kwargs, grids)
        layouts = [self._layout(t, h, w, device) for t, h, w in grids]
        patches = sum(end - start for start, end in rows)
        # (pixels of another dtype than the tower's are gathered as they are; the manager's copy casts them)
        into = {key: out[key].flatten(0, 1)[:patches] for key, like in (("pixel_values", pixels.dtype),
                                                                         ("positions", torch.float32))
                if out and out[key].dtype == like}
        if self.windowed:   # each item's patches in window order: one gather
            order = torch.cat([lay.order + start for lay, (start, _) in zip(layouts, rows)]) if rows else \
                torch.zeros(0, dtype=torch.long, device=device)
            gathered = torch.index_select(pixels, 0, order, **_out(into, "pixel_values"))
        elif rows == [(0, pixels.shape[0])] or not rows and not pixels.shape[0]:
            gathered = into["pixel_values"].copy_(pixels) if into else pixels
        else:
            gathered = torch.cat([pixels[start:end] for start, end in rows], **_out(into, "pixel_values"))
        positions = torch.cat([lay.positions for lay in layouts], **_out(into, "positions")) if layouts else \
            torch.zeros(0, 2, device=device)
        values = {"pixel_values": gathered.unflatten(0, (-1, self.unit)),   # views: [tokens, merge^2, ...]
                  "positions": positions.unflatten(0, (-1, self.unit)),
                  "cu_seqlens": _boundaries([h * w for t, h, w in grids for _ in range(t)], device)}
        if self.windowed:
            values["cu_window_seqlens"] = _boundaries([n for lay in layouts for n in lay.windows], device)
        return values

    @staticmethod
    def _item_rows(mm_kwargs: dict, grids: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """Each item's rows of `pixel_values`: consecutive, unless a selection named them (`item_rows`)."""
        if "item_rows" in mm_kwargs:
            return list(mm_kwargs["item_rows"])
        starts = list(itertools.accumulate((t * h * w for t, h, w in grids), initial=0))
        return list(zip(starts[:-1], starts[1:]))

    def _layout(self, t: int, h: int, w: int, device) -> _Layout:
        return _layout(t, h, w, self.merge, self.window, device)

    # ---- SupportsEncoderCudaGraph ----
    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        keys = ("pixel_values", "positions", "cu_seqlens") + (("cu_window_seqlens",) if self.windowed else ())
        return EncoderCudaGraphConfig(
            buffer_keys=keys, out_hidden_size=self.out_hidden, modalities=("image", "video"),
            token_dims={"pixel_values": {0: "tokens"}, "positions": {0: "tokens"}, "cu_seqlens": 0,
                        "cu_window_seqlens": 0},
            padding_logics={"cu_seqlens": edge_fill, "cu_window_seqlens": edge_fill},
            max_frames_per_video=self.max_frames_per_video)

    def get_encoder_cudagraph_budget_range(self, config) -> tuple[int, int]:
        return self.min_tokens, self.max_batch_tokens

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict) -> list[EncoderItemSpec]:
        specs = []
        for t, h, w in _grids(mm_kwargs["grid_thw"]):
            too_large = h * w > self.max_frame_patches
            reason = (f"a frame of {h}x{w} patches is over max_frame_pixels ({self.max_frame_patches} patches)"
                      if too_large else None)
            specs.append(EncoderItemSpec(input_size=t * h * w, output_tokens=t * h * w // self.unit, frames=t,
                                         eager_reason=reason))
        return specs

    def select_encoder_cudagraph_items(self, mm_kwargs: dict, indices: list[int]) -> dict:
        """The items `indices` without copying their pixels: the same `pixel_values`, with each item's rows named
        (`item_rows`); the buffers gather them once."""
        grids = mm_kwargs["grid_thw"]
        rows = self._item_rows(mm_kwargs, _grids(grids))
        if list(indices) == list(range(len(rows))):
            return mm_kwargs
        return {"pixel_values": mm_kwargs["pixel_values"], "grid_thw": grids[list(indices)],
                "item_rows": [rows[i] for i in indices]}

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch, device,
                                                 dtype, path=DEFAULT_PATH) -> EncoderCudaGraphCaptureInputs:
        values = {"pixel_values": torch.zeros(token_budget, self.unit, self.patch_dim, device=device, dtype=dtype),
                  "positions": torch.zeros(token_budget, self.unit, 2, device=device),
                  # one slot per frame (per window); unused slots repeat the last boundary: empty sequences
                  "cu_seqlens": torch.zeros(max_frames_per_batch + 1, dtype=torch.int32, device=device)}
        if self.windowed:   # a window holds at least one token: never more windows than tokens, plus a frame each
            values["cu_window_seqlens"] = torch.zeros(token_budget + max_frames_per_batch + 1, dtype=torch.int32,
                                                      device=device)
        return EncoderCudaGraphCaptureInputs(values)

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch,
                                                 path=DEFAULT_PATH, out=None) -> EncoderCudaGraphReplayBuffers:
        return EncoderCudaGraphReplayBuffers(self._inputs(mm_kwargs, out))

    def encoder_eager_forward(self, mm_kwargs: dict, path: str = DEFAULT_PATH) -> torch.Tensor:
        longest = max((h * w for _, h, w in _grids(mm_kwargs["grid_thw"])), default=1)
        return self.encoder_cudagraph_forward(self._inputs(mm_kwargs), max_seqlen=longest)

    def postprocess_encoder_output(self, output, mm_kwargs, specs, local_output=None) -> list[torch.Tensor]:
        items = split_by_tokens(output, specs)
        if not self.windowed:
            return items
        device = output.device
        return [item.index_select(0, self._layout(t, h, w, device).reverse)
                for item, (t, h, w) in zip(items, _grids(mm_kwargs["grid_thw"]))]

    def __call__(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """The tower's own forward: its merged tokens, every item packed (what the adapter's outputs equal).
        `grid_thw` goes to the pixels' device first, as a processor's output moved `.to(device)` would be."""
        out = self.tower(pixel_values, grid_thw=grid_thw.to(pixel_values.device))
        return out if isinstance(out, torch.Tensor) else out.pooler_output


class _Layout(NamedTuple):
    """One grid's patch order (window order for window attention), rotary positions in that order, window sizes
    in patches, and the token order that undoes the windows."""
    order: torch.Tensor
    positions: torch.Tensor
    windows: list[int]
    reverse: torch.Tensor


@functools.lru_cache(maxsize=256)
def _layout(t: int, h: int, w: int, merge: int, window: int, device) -> _Layout:
    rows, cols = patch_grid(h, w, merge)                                     # the processor's merge-window order
    positions = torch.stack([rows, cols], dim=-1).repeat(t, 1)             # [t*h*w, 2]
    unit = merge * merge
    tokens = torch.arange(t * (h // merge) * (w // merge))
    windows: list[int] = []
    if window:
        tokens, sizes = _window_order(t, h // merge, w // merge, window)
        windows = [n * unit for n in sizes]
    order = (tokens[:, None] * unit + torch.arange(unit)).reshape(-1)      # patches of each token, in order
    return _Layout(order.to(device), positions[order].to(device), windows, torch.argsort(tokens).to(device))


def _window_order(t: int, h: int, w: int, side: int) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows over a t x h x w grid of output tokens: windows of side x side tokens, row-major
    within each frame (edge windows smaller); returns the tokens in window order and each window's size."""
    index = torch.arange(t * h * w).view(t, h, w)
    order, sizes = [], []
    for frame in range(t):
        for top in range(0, h, side):
            for left in range(0, w, side):
                block = index[frame, top:top + side, left:left + side].reshape(-1)
                order.append(block)
                sizes.append(block.numel())
    return torch.cat(order), sizes


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half style, in fp32 as the towers apply it."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def _out(into: dict[str, torch.Tensor], key: str) -> dict[str, torch.Tensor]:
    return {"out": into[key]} if key in into else {}


def _boundaries(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32).to(device, non_blocking=True)


def _grids(grid_thw: torch.Tensor) -> list[tuple[int, int, int]]:
    return [tuple(row) for row in grid_thw.tolist()]


class FixedImageTower(_TowerAdapter):
    """`SupportsEncoderCudaGraph` for vision towers of one image size (transformers' SigLIP and CLIP vision
    models): each image is `tokens_per_image` rows of `last_hidden_state`, a budget is a number of images, and
    the graph forward is the tower's own forward over a batch of them."""

    def __init__(self, tower: nn.Module, *, max_images: int = 64):
        inner = getattr(tower, "vision_model", tower)
        self.tower = tower
        config = inner.config
        self.image_size, self.channels = config.image_size, config.num_channels
        self.tokens_per_image = inner.embeddings.num_positions
        self.hidden = config.hidden_size
        self.max_images = max_images

    def encoder_cudagraph_forward(self, inputs: dict[str, torch.Tensor], path: str = DEFAULT_PATH) -> torch.Tensor:
        return self.tower(pixel_values=inputs["pixel_values"]).last_hidden_state.flatten(0, 1)

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        return EncoderCudaGraphConfig(buffer_keys=("pixel_values",), out_hidden_size=self.hidden,
                                      token_dims={"pixel_values": 0})

    def get_encoder_cudagraph_budget_range(self, config) -> tuple[int, int]:
        return self.tokens_per_image, self.tokens_per_image * self.max_images

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict) -> list[EncoderItemSpec]:
        pixels = mm_kwargs["pixel_values"]
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (self.channels, self.image_size, self.image_size):
            raise ValueError(f"pixel_values must be [images, {self.channels}, {self.image_size}, {self.image_size}] "
                             f"(the tower's image size), got {tuple(pixels.shape)}")
        return [EncoderItemSpec(input_size=self.tokens_per_image, output_tokens=self.tokens_per_image)
                for _ in range(pixels.shape[0])]

    def select_encoder_cudagraph_items(self, mm_kwargs: dict, indices: list[int]) -> dict:
        pixels = mm_kwargs["pixel_values"]
        if list(indices) == list(range(pixels.shape[0])):
            return mm_kwargs
        return {"pixel_values": pixels[list(indices)]}

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch, device,
                                                 dtype, path=DEFAULT_PATH) -> EncoderCudaGraphCaptureInputs:
        images = token_budget // self.tokens_per_image
        return EncoderCudaGraphCaptureInputs({"pixel_values": torch.zeros(
            images, self.channels, self.image_size, self.image_size, device=device, dtype=dtype)})

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch,
                                                 path=DEFAULT_PATH) -> EncoderCudaGraphReplayBuffers:
        return EncoderCudaGraphReplayBuffers({"pixel_values": mm_kwargs["pixel_values"]})

    def encoder_eager_forward(self, mm_kwargs: dict, path: str = DEFAULT_PATH) -> torch.Tensor:
        return self.encoder_cudagraph_forward(mm_kwargs)

    def postprocess_encoder_output(self, output, mm_kwargs, specs, local_output=None) -> list[torch.Tensor]:
        return split_by_tokens(output, specs)

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The tower's own forward, every image's tokens packed."""
        return self.encoder_cudagraph_forward({"pixel_values": pixel_values})
