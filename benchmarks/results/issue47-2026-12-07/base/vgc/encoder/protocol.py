"""What a model implements to get encoder CUDA graphs, and the records the manager keeps.

The manager knows nothing model-specific: how items are described, sliced, turned into fixed-shape buffers and
assembled back into per-item embeddings is the model's business, through `SupportsEncoderCudaGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import torch

DEFAULT_PATH = "default"
GLOBAL_PATH = "global"
LOCAL_PATH = "local"

# A padding logic writes `value` (the replay value, sized for the real batch) into `buffer` (sized for the
# budget), leaving the rest of the buffer in a state the graph can run on. The default zeroes the buffer and
# copies the value into its leading rows.
PaddingLogic = Callable[[torch.Tensor, torch.Tensor], None]


def edge_fill(buffer: torch.Tensor, value: torch.Tensor) -> None:
    """A `PaddingLogic` for boundary lists like `cu_seqlens`: copy, then repeat the last entry (the padding is
    empty sequences)."""
    n = value.shape[0]
    buffer[:n].copy_(value)
    buffer[n:].copy_(value[-1:].expand(buffer.shape[0] - n))


@dataclass(frozen=True)
class EncoderItemSpec:
    """One image or video as the packer sees it.

    `output_tokens` is what the item costs in a budget (all paths together); `input_size` (e.g. patches) is
    what data-parallel load balancing weighs; `frames` is how many attention sequences the item adds (video
    frames; 1 for an image). Dual-path models also give each path's share. `eager_reason`, when set, says why the
    item must not run in a graph although it fits a budget (e.g. a frame longer than the attention kernel's
    captured maximum): it then runs alone, eagerly, on every path.
    """

    input_size: int
    output_tokens: int
    frames: int = 1
    global_output_tokens: int | None = None
    local_output_tokens: int | None = None
    eager_reason: str | None = None

    def path_tokens(self, path: str) -> int:
        if path == GLOBAL_PATH:
            return self.global_output_tokens if self.global_output_tokens is not None else self.output_tokens
        if path == LOCAL_PATH:
            return self.local_output_tokens or 0
        return self.output_tokens


@dataclass(frozen=True)
class EncoderCudaGraphConfig:
    """A model's static answer to "how do I graph you".

    `buffer_keys`: the inputs recorded into every graph (per path, the keys its capture inputs hold, when
    `path_buffer_keys` is given). `token_dims`: per buffer key, the dim that grows with the budget (and with
    the item count): vgc compiles the graph forward once with those dims dynamic, so every budget shares its
    artifacts. An entry is the dim (`{"cu_seqlens": 0}`) or, for buffers that always have the same size there,
    `{dim: "name"}` with one name for all of them (`{"pixel_values": {0: "patches"}, "positions": {0:
    "patches"}}`): the compiler then knows the sizes are one, as `vgc.compile`'s shape ids say.
    `padding_logics`: per buffer key, how a replay value fills its budget-sized buffer.
    """

    buffer_keys: tuple[str, ...]
    out_hidden_size: int
    modalities: tuple[str, ...] = ("image",)
    token_dims: Mapping[str, int | Mapping[int, str]] = field(default_factory=dict)
    padding_logics: Mapping[str, PaddingLogic] = field(default_factory=dict)
    max_frames_per_video: int = 1
    enable_dual_path_graph: bool = False
    global_token_per_image: int = 0
    local_token_per_patch: int = 0
    path_buffer_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def paths(self) -> tuple[str, ...]:
        return (GLOBAL_PATH, LOCAL_PATH) if self.enable_dual_path_graph else (DEFAULT_PATH,)

    def tokens_per_unit(self, path: str) -> int:
        """Tokens of the unit a path's budgets count in: a whole image (global), a patch (local), a token."""
        return {GLOBAL_PATH: self.global_token_per_image, LOCAL_PATH: self.local_token_per_patch}.get(path, 1)

    def keys_for(self, path: str) -> tuple[str, ...]:
        return tuple(self.path_buffer_keys.get(path, self.buffer_keys))

    def __post_init__(self):
        for key, spec in self.token_dims.items():
            if not _is_token_dim(spec):
                raise ValueError(f"token_dims[{key!r}] must be a dim (int) or {{dim: name}} with one entry, got "
                                 f"{spec!r}")

    def token_dim(self, key: str) -> int | None:
        """The dim of buffer `key` that grows with the budget (None: its size is fixed)."""
        spec = self.token_dims.get(key)
        return spec if spec is None or isinstance(spec, int) else next(iter(spec))

    def shared_dims(self, keys) -> list[list[tuple[str, int]]]:
        """The (key, dim) pairs of `keys` that share one size, one list per name with at least two."""
        groups: dict[str, list[tuple[str, int]]] = {}
        for key in keys:
            spec = self.token_dims.get(key)
            if isinstance(spec, Mapping):
                (dim, name), = spec.items()
                groups.setdefault(name, []).append((key, dim))
        return [pairs for pairs in groups.values() if len(pairs) > 1]


def _is_token_dim(spec) -> bool:
    if isinstance(spec, Mapping):
        return len(spec) == 1 and all(isinstance(d, int) and not isinstance(d, bool) and isinstance(n, str)
                                      for d, n in spec.items())
    return isinstance(spec, int) and not isinstance(spec, bool)


@dataclass
class EncoderCudaGraphCaptureInputs:
    """The tensors a graph is captured with; their storage is what every replay of that graph reads."""

    values: dict[str, torch.Tensor]


@dataclass
class EncoderCudaGraphReplayBuffers:
    """One sub-batch's inputs, sized for its real items; `None` leaves a captured buffer as it is."""

    values: dict[str, torch.Tensor | None]


@dataclass
class BudgetGraphMetadata:
    """One captured graph: its budget, its capacity and the static buffers it reads and writes."""

    path: str
    token_budget: int
    max_batch_size: int
    max_frames_per_batch: int
    graph: Any                               # torch.cuda.CUDAGraph (or the CPU test stand-in)
    input_buffers: dict[str, torch.Tensor]
    output_buffer: torch.Tensor
    memory_bytes: int = 0                    # pool growth while capturing this graph (0 off CUDA)


@runtime_checkable
class SupportsEncoderCudaGraph(Protocol):
    """A vision encoder that can run as budget-sized CUDA graphs.

    Every tensor method works on "mm_kwargs": the model's own dict of batched inputs (pixels, grids). Outputs
    are `[tokens, hidden]` with the items' tokens in item order; padding rows, if any, come last.
    """

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig: ...

    def get_encoder_cudagraph_budget_range(self, config: Any) -> tuple[int, int]:
        """(smallest, largest) token budget worth a graph: the smallest item, and the most tokens a batch may
        hold. `config` is the `vgc.CompilationConfig`."""

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict) -> list[EncoderItemSpec]: ...

    def select_encoder_cudagraph_items(self, mm_kwargs: dict, indices: list[int]) -> dict:
        """The mm_kwargs of items `indices`, in that order."""

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget: int, max_batch_size: int,
                                                 max_frames_per_batch: int, device: torch.device,
                                                 dtype: torch.dtype, path: str = DEFAULT_PATH
                                                 ) -> EncoderCudaGraphCaptureInputs: ...

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs: dict, max_batch_size: int,
                                                 max_frames_per_batch: int, path: str = DEFAULT_PATH
                                                 ) -> EncoderCudaGraphReplayBuffers:
        """The sub-batch's values at its own size. A model whose method also takes `out` (the captured buffers of
        the graph about to replay; None when no graph replays) may write a value straight into the leading rows
        of `out[key]` and return that view: the manager then only pads the rest, and the pixels are copied once."""

    def encoder_cudagraph_forward(self, inputs: dict[str, torch.Tensor], path: str = DEFAULT_PATH
                                  ) -> torch.Tensor:
        """The forward over fixed-shape buffers, as captured; returns `[token_budget, hidden]`."""

    def encoder_eager_forward(self, mm_kwargs: dict, path: str = DEFAULT_PATH) -> torch.Tensor:
        """The forward over exactly these items, without graphs; returns `[tokens, hidden]`."""

    def postprocess_encoder_output(self, output: torch.Tensor | None, mm_kwargs: dict,
                                   specs: list[EncoderItemSpec], local_output: torch.Tensor | None = None
                                   ) -> list[torch.Tensor]:
        """Per-item embeddings from the outputs of one sub-batch (`output` of the default or global path,
        `local_output` of the local path; each holds exactly the sub-batch's tokens)."""


def split_by_tokens(output: torch.Tensor, specs: list[EncoderItemSpec]) -> list[torch.Tensor]:
    """The common post-processing: item i owns the next `specs[i].output_tokens` rows."""
    return list(torch.split(output, [s.output_tokens for s in specs]))


def missing_methods(model: Any) -> list[str]:
    """The protocol's methods `model` lacks (empty when it implements them all)."""
    names = [n for n in vars(SupportsEncoderCudaGraph) if not n.startswith("_") and
             callable(getattr(SupportsEncoderCudaGraph, n, None))]
    return [n for n in names if not callable(getattr(model, n, None))]
