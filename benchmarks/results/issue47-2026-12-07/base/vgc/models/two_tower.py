"""Reference two-tower (dual-path) vision encoder, DeepSeek-OCR-like, implementing `SupportsEncoderCudaGraph`.

Every image has one global view (a fixed-size picture of the whole image) and 0..N local crops (fixed-size
tiles of it). Two towers with their own weights encode them: the global tower each global view, the local tower
each crop. A tower is a small ViT over a fixed-length sequence: patch embedding, a fixed 2-D sinusoidal position
embedding, pre-norm blocks whose attention stays within one view (plain `scaled_dot_product_attention` on
`[views, heads, patches, head_dim]`: every sequence has the same length, so no varlen op is needed) and a merger
that turns each `merge x merge` window of patches into one output token.

mm_kwargs (what `make_images` builds and every protocol method takes):
  global_pixel_values [images * global_patches, patch_dim]   each view's patches in merge-window order
  local_pixel_values  [crops * local_patches, patch_dim]     the crops of image 0, then of image 1, ...
  num_crops           LongTensor[images], on the CPU          crops per image (0 allowed)

Image i's embedding is its crops' tokens, then its global tokens. The two towers are the two paths of vgc's
dual-path encoder graphs: "global" costs `global_tokens` per image, "local" `local_tokens` per crop, and each
path's buffer is `[views, patches, patch_dim]`, so the number of views is the one dynamic size (every reshape in
the forward is then exact and vgc compiles each tower once, without divisibility guards).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..encoder.protocol import (EncoderCudaGraphCaptureInputs, EncoderCudaGraphConfig, EncoderCudaGraphReplayBuffers,
                                EncoderItemSpec, GLOBAL_PATH, LOCAL_PATH)
from .vit import patch_grid, PreNormBlock

__all__ = ["TowerConfig", "TwoTowerConfig", "TwoTowerEncoder", "tiny_config", "bench_config", "make_images",
           "patchify", "PIXEL_KEYS"]

# The buffer each path reads.
PIXEL_KEYS = {GLOBAL_PATH: "global_pixel_values", LOCAL_PATH: "local_pixel_values"}


@dataclasses.dataclass
class TowerConfig:
    depth: int
    dim: int
    num_heads: int
    mlp_dim: int
    view: tuple[int, int]           # (height, width) in pixels of every view this tower encodes


@dataclasses.dataclass
class TwoTowerConfig:
    global_tower: TowerConfig
    local_tower: TowerConfig
    out_hidden: int
    patch_size: int = 16
    in_channels: int = 3
    merge: int = 2                  # a merge x merge window of patches becomes one output token
    max_images_per_batch: int = 16  # the largest token budget holds this many images' global tokens
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def __post_init__(self):
        for name in ("global_tower", "local_tower"):
            tower = getattr(self, name)
            if isinstance(tower, dict):
                tower = TowerConfig(**tower)
                setattr(self, name, tower)
            unit = self.patch_size * self.merge
            if tower.view[0] % unit or tower.view[1] % unit:
                raise ValueError(f"{name}: a view of {tower.view[0]}x{tower.view[1]} pixels does not split into "
                                 f"{self.merge}x{self.merge} windows of {self.patch_size}-pixel patches")
            if tower.dim % tower.num_heads or (tower.dim // tower.num_heads) % 2 or tower.dim % 4:
                raise ValueError(f"{name}: dim {tower.dim} must split into {tower.num_heads} heads and into the "
                                 "four quarters of the 2-D sinusoidal position embedding")

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.patch_size ** 2

    def tower(self, path: str) -> TowerConfig:
        return self.global_tower if path == GLOBAL_PATH else self.local_tower

    def grid(self, path: str) -> tuple[int, int]:
        """(rows, cols) of patches of one view of `path`."""
        h, w = self.tower(path).view
        return h // self.patch_size, w // self.patch_size

    def patches(self, path: str) -> int:
        rows, cols = self.grid(path)
        return rows * cols

    def tokens(self, path: str) -> int:
        return self.patches(path) // self.merge ** 2

    @property
    def global_tokens(self) -> int:
        return self.tokens(GLOBAL_PATH)

    @property
    def local_tokens(self) -> int:
        return self.tokens(LOCAL_PATH)


def tiny_config() -> TwoTowerConfig:
    # 4-pixel patches of 1 channel: a 16x16 global view is 4x4 patches, 4 tokens; an 8x16 crop is 2x4, 2 tokens.
    return TwoTowerConfig(global_tower=TowerConfig(depth=2, dim=32, num_heads=2, mlp_dim=64, view=(16, 16)),
                          local_tower=TowerConfig(depth=1, dim=32, num_heads=2, mlp_dim=64, view=(8, 16)),
                          out_hidden=24, patch_size=4, in_channels=1, merge=2, max_images_per_batch=8)


def bench_config() -> TwoTowerConfig:
    # DeepSeek-OCR's geometry: a 1024^2 global view and 640^2 crops in 16-pixel patches, 16x compressed (4x4
    # windows) to 256 and 100 tokens. Two 12-layer, 768-wide towers (SAM/CLIP-base sized), output to a
    # 1280-wide LM; budgets up to 16 images' global tokens (4096), which also bounds the local path (40 crops).
    tower = dict(depth=12, dim=768, num_heads=12, mlp_dim=3072)
    return TwoTowerConfig(global_tower=TowerConfig(**tower, view=(1024, 1024)),
                          local_tower=TowerConfig(**tower, view=(640, 640)),
                          out_hidden=1280, patch_size=16, in_channels=3, merge=4, max_images_per_batch=16,
                          dtype=torch.bfloat16)


class _Block(PreNormBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x is [views, patches, dim]; attention runs within each view.
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.num_heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v)                     # [views, heads, patches, head_dim]
        return self.mlp(x + self.proj(attn.transpose(1, 2).flatten(2)))


class _Tower(nn.Module):
    """`[views, patches, patch_dim]` -> `[views, tokens, out_hidden]`."""

    def __init__(self, cfg: TwoTowerConfig, path: str):
        super().__init__()
        tower = cfg.tower(path)
        self.patch_embed = nn.Linear(cfg.patch_dim, tower.dim)
        self.blocks = nn.ModuleList(_Block(tower.dim, tower.num_heads, tower.mlp_dim) for _ in range(tower.depth))
        self.merger_norm = nn.LayerNorm(tower.dim, eps=1e-6)
        merged = tower.dim * cfg.merge ** 2
        self.merger_fc1 = nn.Linear(merged, tower.dim)
        self.merger_fc2 = nn.Linear(tower.dim, cfg.out_hidden)
        self.tokens, self.window = cfg.tokens(path), cfg.merge ** 2
        # Not a parameter: fixed sizes the manager's trace must avoid are the parameters' (see _trace there).
        self.register_buffer("pos_embed", _sincos_2d(*cfg.grid(path), cfg.merge, tower.dim), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels) + self.pos_embed.to(pixels.dtype)    # [views, patches, dim]
        for block in self.blocks:
            x = block(x)
        x = self.merger_norm(x).unflatten(1, (self.tokens, self.window)).flatten(2)   # [views, tokens, merge^2*dim]
        return self.merger_fc2(F.gelu(self.merger_fc1(x)))


def _sincos_2d(rows: int, cols: int, merge: int, dim: int) -> torch.Tensor:
    """[rows*cols, dim] position embedding in merge-window order: sin/cos of the row (first half), of the column."""
    r, c = patch_grid(rows, cols, merge)
    quarter = dim // 4
    freq = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    angles = [r[:, None] * freq, c[:, None] * freq]
    return torch.cat([f(a) for a in angles for f in (torch.sin, torch.cos)], dim=-1)


class TwoTowerEncoder(nn.Module):
    """Random weights, deterministic from `cfg.seed`. `forward(**mm_kwargs)` returns one `[tokens_i, out_hidden]`
    per image (its crops' tokens, then its global tokens); `SupportsEncoderCudaGraph` methods let
    `EncoderCudaGraphManager` serve it with dual-path graphs."""

    def __init__(self, cfg: TwoTowerConfig):
        super().__init__()
        self.cfg = cfg
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.global_tower = _Tower(cfg, GLOBAL_PATH)
        self.local_tower = _Tower(cfg, LOCAL_PATH)
        torch.random.set_rng_state(generator_state)
        self.to(cfg.dtype)

    # ---- the model ----
    def forward(self, global_pixel_values: torch.Tensor, local_pixel_values: torch.Tensor,
                num_crops: torch.Tensor) -> list[torch.Tensor]:
        """Both towers eagerly on exactly these images, then per-image assembly: the reference."""
        mm_kwargs = {"global_pixel_values": global_pixel_values, "local_pixel_values": local_pixel_values,
                     "num_crops": num_crops}
        specs = self.get_encoder_cudagraph_item_specs(mm_kwargs)
        if not specs:
            return []
        global_out = self.encoder_eager_forward(mm_kwargs, GLOBAL_PATH)
        local_out = self.encoder_eager_forward(mm_kwargs, LOCAL_PATH) if sum(_crops(num_crops)) else None
        return self.postprocess_encoder_output(global_out, mm_kwargs, specs, local_output=local_out)

    def tower(self, path: str) -> _Tower:
        if path not in PIXEL_KEYS:
            raise ValueError(f"TwoTowerEncoder has paths {tuple(PIXEL_KEYS)}, not {path!r}")
        return self.global_tower if path == GLOBAL_PATH else self.local_tower

    def _views(self, mm_kwargs: dict, path: str) -> torch.Tensor:
        """The path's pixels as `[views, patches, patch_dim]`."""
        pixels = mm_kwargs[PIXEL_KEYS[path]]
        return pixels.view(-1, self.cfg.patches(path), pixels.shape[-1])

    # ---- SupportsEncoderCudaGraph ----
    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        keys = tuple(PIXEL_KEYS.values())
        return EncoderCudaGraphConfig(
            buffer_keys=keys, out_hidden_size=self.cfg.out_hidden, token_dims={k: 0 for k in keys},
            enable_dual_path_graph=True, global_token_per_image=self.cfg.global_tokens,
            local_token_per_patch=self.cfg.local_tokens,
            path_buffer_keys={path: (key,) for path, key in PIXEL_KEYS.items()})

    def get_encoder_cudagraph_budget_range(self, config) -> tuple[int, int]:
        return self.cfg.global_tokens, self.cfg.max_images_per_batch * self.cfg.global_tokens

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict) -> list[EncoderItemSpec]:
        per_image, per_crop = self.cfg.global_tokens, self.cfg.local_tokens
        patches_g, patches_l = self.cfg.patches(GLOBAL_PATH), self.cfg.patches(LOCAL_PATH)
        return [EncoderItemSpec(input_size=patches_g + n * patches_l, output_tokens=per_image + n * per_crop,
                                global_output_tokens=per_image, local_output_tokens=n * per_crop)
                for n in _crops(mm_kwargs["num_crops"])]

    def select_encoder_cudagraph_items(self, mm_kwargs: dict, indices: list[int]) -> dict:
        crops = _crops(mm_kwargs["num_crops"])
        indices = list(indices)
        if indices == list(range(len(crops))):
            return mm_kwargs
        global_views, local_views = self._views(mm_kwargs, GLOBAL_PATH), self._views(mm_kwargs, LOCAL_PATH)
        starts = [0, *itertools.accumulate(crops)]
        local = [local_views[starts[i]:starts[i + 1]] for i in indices]
        return {"global_pixel_values": global_views[indices].flatten(0, 1),
                "local_pixel_values": torch.cat(local).flatten(0, 1) if local else local_views[:0].flatten(0, 1),
                "num_crops": mm_kwargs["num_crops"][indices]}

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget, max_batch_size, max_frames_per_batch, device,
                                                 dtype, path=GLOBAL_PATH) -> EncoderCudaGraphCaptureInputs:
        views = math.ceil(token_budget / self.cfg.tokens(path))   # budgets are whole views; ceil is for safety
        shape = (views, self.cfg.patches(path), self.cfg.patch_dim)
        return EncoderCudaGraphCaptureInputs({PIXEL_KEYS[path]: torch.zeros(shape, device=device, dtype=dtype)})

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames_per_batch,
                                                 path=GLOBAL_PATH) -> EncoderCudaGraphReplayBuffers:
        # The sub-batch's own views; the manager zero-pads dim 0 up to the budget (zero views attend only to
        # themselves, so they change no real view's output).
        return EncoderCudaGraphReplayBuffers({PIXEL_KEYS[path]: self._views(mm_kwargs, path)})

    def encoder_cudagraph_forward(self, inputs: dict[str, torch.Tensor], path: str = GLOBAL_PATH) -> torch.Tensor:
        return self.tower(path)(inputs[PIXEL_KEYS[path]]).flatten(0, 1)   # [views * tokens, out_hidden]

    def encoder_eager_forward(self, mm_kwargs: dict, path: str = GLOBAL_PATH) -> torch.Tensor:
        return self.encoder_cudagraph_forward({PIXEL_KEYS[path]: self._views(mm_kwargs, path)}, path)

    def postprocess_encoder_output(self, output, mm_kwargs, specs, local_output=None) -> list[torch.Tensor]:
        if not specs:
            return []
        if output is None:
            raise ValueError("postprocess_encoder_output: every image has global tokens, but the global output "
                             "is None")
        global_parts = torch.split(output, [s.path_tokens(GLOBAL_PATH) for s in specs])
        local_sizes = [s.path_tokens(LOCAL_PATH) for s in specs]
        if local_output is None:
            if any(local_sizes):
                raise ValueError(f"postprocess_encoder_output: images with {sum(local_sizes)} local tokens, but "
                                 "the local output is None")
            return list(global_parts)
        local_parts = torch.split(local_output, local_sizes)
        return [torch.cat([loc, glo]) if loc.shape[0] else glo for loc, glo in zip(local_parts, global_parts)]


def _crops(num_crops: torch.Tensor) -> list[int]:
    return [int(n) for n in num_crops.tolist()]


def patchify(cfg: TwoTowerConfig, images: torch.Tensor) -> torch.Tensor:
    """`[views, C, H, W]` pixels -> `[views * patches, patch_dim]`, each view's patches in merge-window order (the
    layout `global_pixel_values` and `local_pixel_values` expect)."""
    n, c, h, w = images.shape
    p, m = cfg.patch_size, cfg.merge
    if h % (p * m) or w % (p * m):
        raise ValueError(f"{h}x{w} pixels do not split into {m}x{m} windows of {p}-pixel patches")
    x = images.reshape(n, c, h // (p * m), m, p, w // (p * m), m, p)
    # (view, window row, window col, row in window, col in window, channel, pixel row, pixel col)
    return x.permute(0, 2, 5, 3, 6, 1, 4, 7).reshape(-1, c * p * p)


def make_images(cfg: TwoTowerConfig, crops: list[int], *, device="cpu", seed: int = 0) -> dict:
    """Random mm_kwargs for `len(crops)` images, image i with `crops[i]` local crops. Pixels are drawn on `device`
    (the same seed gives the same pixels on the same kind of device)."""
    if any(n < 0 for n in crops):
        raise ValueError(f"crop counts must be >= 0, got {crops}")
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(views: int, path: str) -> torch.Tensor:
        shape = (views * cfg.patches(path), cfg.patch_dim)
        return torch.randn(shape, generator=generator, device=device).to(cfg.dtype)

    return {"global_pixel_values": draw(len(crops), GLOBAL_PATH), "local_pixel_values": draw(sum(crops), LOCAL_PATH),
            "num_crops": torch.tensor(list(crops), dtype=torch.long).reshape(-1)}
