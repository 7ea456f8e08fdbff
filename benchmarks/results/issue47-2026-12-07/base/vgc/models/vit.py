"""Reference Qwen2-VL-style vision encoder over packed patches, implementing `SupportsEncoderCudaGraph`.

Images and videos arrive as one packed patch matrix (`pixel_values [patches, C*T*p*p]`, each item's patches in
2x2 merge-window order, as the processor writes them) and a grid per item (`grid_thw [items, 3]`: frames,
height and width in patches). The encoder embeds patches, applies 2-D rotary positions, runs blocks whose
attention is `vgc::varlen_attention` within each frame, and merges 2x2 patches into one output token.

The forward over fixed-size buffers (`encoder_cudagraph_forward`) is what CUDA graphs capture and what the eager
path runs at the batch's own size, so graph and eager outputs agree up to kernel choice.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops  # noqa: F401  (registers torch.ops.vgc.varlen_attention)
from ..encoder.protocol import (DEFAULT_PATH, edge_fill, EncoderCudaGraphCaptureInputs, EncoderCudaGraphConfig,
                                EncoderCudaGraphReplayBuffers, EncoderItemSpec, split_by_tokens)

__all__ = ["VisionConfig", "VisionEncoder", "PreNormBlock", "tiny_vit_config", "qwen2_vl_vit_config", "make_images",
           "patch_grid"]


@dataclasses.dataclass
class VisionConfig:
    depth: int
    dim: int
    num_heads: int
    mlp_dim: int
    out_hidden: int
    patch_size: int = 14
    temporal_patch: int = 2
    in_channels: int = 3
    merge: int = 2
    min_pixels: int = 224 * 224        # the smallest image the processor emits: the smallest token budget
    max_pixels: int = 1344 * 1344      # the largest frame: bounds one attention sequence
    max_frames_per_video: int = 16     # grid frames (input frames / temporal_patch)
    max_batch_tokens: int = 16384      # the largest token budget
    dtype: torch.dtype = torch.float32
    seed: int = 0

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch * self.patch_size ** 2

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def tokens(self, side_pixels: int) -> int:
        side = side_pixels // (self.patch_size * self.merge)
        return side * side


def tiny_vit_config() -> VisionConfig:
    # 2 layers, 8-pixel patches of 1 channel: a 32x32 image is 4x4 patches, 4 tokens.
    return VisionConfig(depth=2, dim=32, num_heads=2, mlp_dim=64, out_hidden=24, patch_size=8, temporal_patch=1,
                        in_channels=1, min_pixels=32 * 32, max_pixels=128 * 128, max_frames_per_video=4,
                        max_batch_tokens=256)


def qwen2_vl_vit_config() -> VisionConfig:
    # Qwen2-VL's vision tower shape: depth 32, width 1280, 16 heads, MLP 5120, output to a 3584-wide LM.
    return VisionConfig(depth=32, dim=1280, num_heads=16, mlp_dim=5120, out_hidden=3584, dtype=torch.bfloat16)


class PreNormBlock(nn.Module):
    """The weights of a pre-norm ViT layer and its MLP half; each encoder's subclass says how attention mixes
    tokens (packed varlen sequences here, fixed-length views in `two_tower`)."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)
        self.num_heads, self.head_dim = num_heads, dim // num_heads

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class _Block(PreNormBlock):
    def __init__(self, cfg: VisionConfig):
        super().__init__(cfg.dim, cfg.num_heads, cfg.mlp_dim)
        self.max_seqlen = cfg.max_pixels // cfg.patch_size ** 2
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x, cos, sin, cu_seqlens):
        # x is [patches, dim], patches = merge*merge times the token count, the one dynamic size.
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        attn = torch.ops.vgc.varlen_attention(q, k, v, cu_seqlens, self.max_seqlen, self.scale)
        return self.mlp(x + self.proj(attn.flatten(1)))


def _rotate(x, cos, sin):
    """2-D rotary embedding, rotate-half style: x is [patches, heads, head_dim], cos/sin [patches, head_dim/2]
    (height angles, then width)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class VisionEncoder(nn.Module):
    """Random weights, deterministic from `cfg.seed`. `forward(pixel_values, grid_thw)` returns the tokens of all
    items, packed; `SupportsEncoderCudaGraph` methods let `EncoderCudaGraphManager` serve it."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.dim, bias=False)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.merger_norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        merged = cfg.dim * cfg.merge ** 2
        self.merger_fc1 = nn.Linear(merged, merged)
        self.merger_fc2 = nn.Linear(merged, cfg.out_hidden)
        torch.random.set_rng_state(generator_state)
        self.to(cfg.dtype)
        quarter = cfg.head_dim // 4
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter),
                             persistent=False)
        self._positions: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    # ---- the model ----
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        inputs = self._inputs({"pixel_values": pixel_values, "grid_thw": grid_thw})
        return self.encoder_cudagraph_forward(inputs)

    def encoder_cudagraph_forward(self, inputs: dict[str, torch.Tensor], path: str = DEFAULT_PATH) -> torch.Tensor:
        # [tokens, merge^2, ...] buffers as [patches, ...]: every matmul sees 2-D inputs, and the token count
        # stays the one size (patches is exactly merge^2 times it)
        grouped = inputs["pixel_values"]
        x = self.patch_embed(grouped.flatten(0, 1))                             # [patches, dim]
        rows, cols = inputs["positions"].flatten(0, 1).unbind(-1)
        angles = torch.cat([rows[..., None] * self.inv_freq, cols[..., None] * self.inv_freq], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        for block in self.blocks:
            x = block(x, cos, sin, inputs["cu_seqlens"])
        x = self.merger_norm(x).reshape(grouped.shape[0], -1)                 # [tokens, merge^2 * dim]
        return self.merger_fc2(F.gelu(self.merger_fc1(x)))

    def _inputs(self, mm_kwargs: dict, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The forward's buffers at the batch's own size: patches, their rows and columns (fp32, a buffer of
        their own whose token dim the config says is the patches' one), frame boundaries. With `out` (a graph's
        captured buffers) patches and positions are written straight into their leading rows.
        """
        grids = _grids(mm_kwargs["grid_thw"])
        longest = self.cfg.max_pixels // self.cfg.patch_size ** 2
        for t, h, w in grids:
            if h * w > longest:   # the attention kernel is bounded by the largest frame: refuse, never truncate
                raise ValueError(f"a frame of {h}x{w} patches is larger than this encoder's max_pixels "
                                 f"({self.cfg.max_pixels} pixels, {longest} patches); resize it or raise max_pixels")
        pixels = mm_kwargs["pixel_values"]
        device = pixels.device
        positions = [self._frame_positions(h, w, device) for t, h, w in grids for _ in range(t)]
        frames = [h * w for t, h, w in grids for _ in range(t)]
        cu = torch.tensor([0, *itertools.accumulate(frames)], dtype=torch.int32).to(device, non_blocking=True)
        if out is not None and out["pixel_values"].dtype == pixels.dtype:
            pixels = out["pixel_values"].flatten(0, 1)[:pixels.shape[0]].copy_(pixels)
        where = out["positions"].flatten(0, 1)[:pixels.shape[0]] if out is not None else None
        where = torch.cat(positions, out=where) if positions else torch.zeros(0, 2, device=device)
        unit = self.cfg.merge ** 2
        return {"pixel_values": pixels.unflatten(0, (-1, unit)), "positions": where.unflatten(0, (-1, unit)),
                "cu_seqlens": cu}

    def _frame_positions(self, h: int, w: int, device) -> torch.Tensor:
        key = (h, w, device)
        if key not in self._positions:
            rows, cols = patch_grid(h, w, self.cfg.merge)
            self._positions[key] = torch.stack([rows, cols], dim=-1).to(device)
        return self._positions[key]

    # ---- SupportsEncoderCudaGraph ----
    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        return EncoderCudaGraphConfig(
            buffer_keys=("pixel_values", "positions", "cu_seqlens"),
            out_hidden_size=self.cfg.out_hidden, modalities=("image", "video"),
            token_dims={"pixel_values": {0: "tokens"}, "positions": {0: "tokens"}, "cu_seqlens": 0},
            padding_logics={"cu_seqlens": edge_fill}, max_frames_per_video=self.cfg.max_frames_per_video)

    def get_encoder_cudagraph_budget_range(self, config) -> tuple[int, int]:
        per_patch_side = self.cfg.patch_size * self.cfg.merge
        smallest = max(1, (math.isqrt(self.cfg.min_pixels) // per_patch_side) ** 2)
        return smallest, self.cfg.max_batch_tokens

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict) -> list[EncoderItemSpec]:
        merge = self.cfg.merge ** 2
        return [EncoderItemSpec(input_size=t * h * w, output_tokens=t * h * w // merge, frames=t)
                for t, h, w in _grids(mm_kwargs["grid_thw"])]

    def select_encoder_cudagraph_items(self, mm_kwargs: dict, indices: list[int]) -> dict:
        grids = mm_kwargs["grid_thw"]
        sizes = [t * h * w for t, h, w in _grids(grids)]
        starts = [0, *itertools.accumulate(sizes)]
        pixels = mm_kwargs["pixel_values"]
        if list(indices) == list(range(len(sizes))):
            return mm_kwargs
        parts = [pixels[starts[i]:starts[i + 1]] for i in indices]
        return {"pixel_values": torch.cat(parts) if parts else pixels[:0], "grid_thw": grids[list(indices)]}

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch, device,
                                                 dtype, path=DEFAULT_PATH) -> EncoderCudaGraphCaptureInputs:
        return EncoderCudaGraphCaptureInputs({
            "pixel_values": torch.zeros(token_budget, self.cfg.merge ** 2, self.cfg.patch_dim, device=device,
                                        dtype=dtype),
            "positions": torch.zeros(token_budget, self.cfg.merge ** 2, 2, device=device),
            # One slot per frame; unused slots repeat the last boundary (empty sequences cost nothing).
            "cu_seqlens": torch.zeros(max_frames_per_batch + 1, dtype=torch.int32, device=device),
        })

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch,
                                                 path=DEFAULT_PATH, out=None) -> EncoderCudaGraphReplayBuffers:
        return EncoderCudaGraphReplayBuffers(self._inputs(mm_kwargs, out))

    def encoder_eager_forward(self, mm_kwargs: dict, path: str = DEFAULT_PATH) -> torch.Tensor:
        return self.encoder_cudagraph_forward(self._inputs(mm_kwargs))

    def postprocess_encoder_output(self, output, mm_kwargs, specs, local_output=None) -> list[torch.Tensor]:
        return split_by_tokens(output, specs)


def _grids(grid_thw: torch.Tensor) -> list[tuple[int, int, int]]:
    return [tuple(row) for row in grid_thw.tolist()]


@functools.lru_cache(maxsize=256)
def patch_grid(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch of an h x w frame, in merge-window order (each merge x merge window's
    patches consecutive, windows row-major), the order in which the merger groups them."""
    if h % merge or w % merge:
        raise ValueError(f"a frame of {h}x{w} patches does not split into {merge}x{merge} merge windows")
    rows = torch.arange(h, device="cpu").view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
    cols = torch.arange(w, device="cpu").view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
    order = (0, 2, 1, 3)   # (window row, window col, row in window, col in window)
    return rows.permute(order).reshape(-1).float(), cols.permute(order).reshape(-1).float()


def make_images(cfg: VisionConfig, sides: list[tuple[int, int]] | list[int], *, frames: list[int] | None = None,
                device="cpu", seed: int = 0) -> dict:
    """Random mm_kwargs for items of the given pixel sizes (`(height, width)` or a square side); `frames[i]` > 1
    makes item i a video of that many input frames."""
    g = torch.Generator().manual_seed(seed)
    unit = cfg.patch_size * cfg.merge
    grids = []
    for i, side in enumerate(sides):
        height, width = (side, side) if isinstance(side, int) else side
        t = max(1, (frames[i] if frames else 1) // cfg.temporal_patch)
        grids.append((t, height // unit * cfg.merge, width // unit * cfg.merge))
    patches = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(patches, cfg.patch_dim, generator=g).to(device=device, dtype=cfg.dtype)
    return {"pixel_values": pixels, "grid_thw": torch.tensor(grids, dtype=torch.long).reshape(-1, 3)}
