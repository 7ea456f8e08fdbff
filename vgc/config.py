"""User-facing configuration: `CompilationConfig`, its enums, validation and the config hash."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("vgc")


class CUDAGraphMode(enum.Enum):
    NONE = "none"
    PIECEWISE = "piecewise"
    FULL = "full"
    FULL_AND_PIECEWISE = "full_and_piecewise"


class DynamicShapesType(enum.Enum):
    BACKED = "backed"
    UNBACKED = "unbacked"
    BACKED_SIZE_OBLIVIOUS = "backed_size_oblivious"


class CompileCacheSaveFormat(enum.Enum):
    BINARY = "binary"
    UNPACKED = "unpacked"


def parse_enum(enum_cls: type[enum.Enum], value: Any, what: str) -> enum.Enum:
    """Accept an enum member or its name/value as a case-insensitive string."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        for member in enum_cls:
            if key in (member.value, member.name.lower()):
                return member
    accepted = ", ".join(repr(m.value) for m in enum_cls)
    raise ValueError(f"{what} must be one of {accepted} (or {enum_cls.__name__}.<NAME>), got {value!r}")


@dataclass
class DynamicShapesConfig:
    type: DynamicShapesType = DynamicShapesType.BACKED

    def __post_init__(self):
        self.type = parse_enum(DynamicShapesType, self.type, "dynamic_shapes_config.type")


def _default_splitting_ops() -> list[str]:
    return ["vgc::attention"]


# Fields that change where things are stored or how compiled code is replayed, not the code Inductor generates:
# one cache entry serves every CUDA-graph mode and capture list.
_NOT_IN_HASH = frozenset({"cache_dir", "compile_cache_save_format", "debug", "cudagraph_mode",
                          "cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mm_encoder",
                          "encoder_cudagraph_token_budgets", "encoder_cudagraph_max_vision_items_per_batch",
                          "encoder_cudagraph_max_frames_per_batch"})


@dataclass
class CompilationConfig:
    """How vgc compiles a model. Every field is validated at construction.

    See SPEC §2; fields marked "not built yet" in `docs/` are accepted but warn that they have no effect.
    """

    splitting_ops: list[str] | None = None
    compile_sizes: list[int] = field(default_factory=list)
    inductor_compile_config: dict[str, Any] = field(default_factory=dict)
    # Added for the static compile_sizes artifacts only: tuning that pays at one fixed size (coordinate descent
    # turns an M=1 matmul into a fusable reduction) without slowing the symbolic-size code.
    compile_sizes_inductor_config: dict[str, Any] = field(default_factory=dict)
    cudagraph_mode: CUDAGraphMode | None = None
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int = 512
    dynamic_shapes_config: DynamicShapesConfig = field(default_factory=DynamicShapesConfig)
    cache_dir: str | None = None
    compile_cache_save_format: CompileCacheSaveFormat | None = None
    cudagraph_mm_encoder: bool = False
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)
    encoder_cudagraph_max_vision_items_per_batch: int = 0
    encoder_cudagraph_max_frames_per_batch: int | None = None
    debug: bool = False   # CUDA graphs: check replayed inputs' addresses; compare sampled replays with eager

    def __post_init__(self):
        if self.splitting_ops is None:
            self.splitting_ops = _default_splitting_ops()
        self.splitting_ops = [_check_op_name(op) for op in _as_list(self.splitting_ops, "splitting_ops")]
        self.compile_sizes = sorted(set(_positive_ints(self.compile_sizes, "compile_sizes")))
        for name in ("inductor_compile_config", "compile_sizes_inductor_config"):
            _check_inductor_options(name, getattr(self, name))
        if self.cudagraph_mode is not None:
            self.cudagraph_mode = parse_enum(CUDAGraphMode, self.cudagraph_mode, "cudagraph_mode")
        if isinstance(self.max_cudagraph_capture_size, bool) or not isinstance(self.max_cudagraph_capture_size, int) \
                or self.max_cudagraph_capture_size < 1:
            raise ValueError(f"max_cudagraph_capture_size must be a positive int, got {self.max_cudagraph_capture_size!r}")
        if self.cudagraph_capture_sizes is not None:
            self.cudagraph_capture_sizes = sorted(set(_positive_ints(self.cudagraph_capture_sizes,
                                                                     "cudagraph_capture_sizes")))
        if isinstance(self.dynamic_shapes_config, (str, DynamicShapesType)):
            self.dynamic_shapes_config = DynamicShapesConfig(type=self.dynamic_shapes_config)
        elif isinstance(self.dynamic_shapes_config, dict):
            self.dynamic_shapes_config = DynamicShapesConfig(**self.dynamic_shapes_config)
        elif not isinstance(self.dynamic_shapes_config, DynamicShapesConfig):
            raise ValueError("dynamic_shapes_config must be a DynamicShapesConfig, a dict or one of "
                             f"'backed', 'unbacked', 'backed_size_oblivious', got {self.dynamic_shapes_config!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise ValueError(f"cache_dir must be a path string or None, got {self.cache_dir!r}")
        if self.compile_cache_save_format is not None:
            self.compile_cache_save_format = parse_enum(
                CompileCacheSaveFormat, self.compile_cache_save_format, "compile_cache_save_format")
        if not isinstance(self.cudagraph_mm_encoder, bool):
            raise ValueError(f"cudagraph_mm_encoder must be True or False, got {self.cudagraph_mm_encoder!r}")
        self.encoder_cudagraph_token_budgets = sorted(set(_positive_ints(
            self.encoder_cudagraph_token_budgets, "encoder_cudagraph_token_budgets")))
        items = self.encoder_cudagraph_max_vision_items_per_batch
        if isinstance(items, bool) or not isinstance(items, int) or items < 0:
            raise ValueError(f"encoder_cudagraph_max_vision_items_per_batch must be an int >= 0, got {items!r}")
        frames = self.encoder_cudagraph_max_frames_per_batch
        if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 0):
            raise ValueError(f"encoder_cudagraph_max_frames_per_batch must be None or an int >= 0, got {frames!r}")
        self._warn_unbuilt()

    # Encoder graphs are not built yet: say so instead of silently ignoring the setting.
    def _warn_unbuilt(self):
        unbuilt = {
            "cudagraph_mm_encoder": self.cudagraph_mm_encoder,
            "encoder_cudagraph_token_budgets": bool(self.encoder_cudagraph_token_budgets),
            "encoder_cudagraph_max_vision_items_per_batch": bool(self.encoder_cudagraph_max_vision_items_per_batch),
            "encoder_cudagraph_max_frames_per_batch": self.encoder_cudagraph_max_frames_per_batch is not None,
        }
        for name, is_set in unbuilt.items():
            if is_set:
                logger.warning("vgc: %s is accepted but has no effect yet (encoder CUDA graphs are not built)", name)

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> "CompilationConfig":
        """Build a config from `torch.compile(..., options={...})`; unknown keys are errors."""
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown vgc option(s) {unknown}; accepted options are {sorted(known)}")
        return cls(**options)

    def resolved_cudagraph_mode(self, device_type: str) -> CUDAGraphMode:
        if self.cudagraph_mode is None:
            return CUDAGraphMode.PIECEWISE if device_type == "cuda" else CUDAGraphMode.NONE
        return self.cudagraph_mode

    def resolved_capture_sizes(self) -> list[int]:
        """The capture sizes: the user's list, else 1, 2, 4 and multiples of 8 up to the maximum."""
        cap = self.max_cudagraph_capture_size
        if self.cudagraph_capture_sizes is not None:
            return [s for s in self.cudagraph_capture_sizes if s <= cap]
        return sorted({s for s in (1, 2, 4) if s <= cap} | set(range(8, cap + 1, 8)))

    def hash_factors(self) -> dict[str, Any]:
        factors = {}
        for f in dataclasses.fields(self):
            if f.name not in _NOT_IN_HASH:
                factors[f.name] = _normalize(getattr(self, f.name))
        return factors

    def compute_hash(self) -> str:
        """Hash of the fields that change generated code (not where or whether it is cached)."""
        blob = json.dumps(self.hash_factors(), sort_keys=True, default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _normalize(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: _normalize(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if callable(value):
        # A custom pass object is hashed by its uuid(); other callables by qualified name.
        uuid = getattr(value, "uuid", None)
        return uuid() if callable(uuid) else f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}"
    return value


def _as_list(value: Any, what: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"{what} must be a list, got {type(value).__name__} {value!r}")


def _positive_ints(value: Any, what: str) -> list[int]:
    values = _as_list(value, what)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be positive ints, got {v!r}")
    return values


def _check_op_name(op: Any) -> str:
    if not isinstance(op, str) or "::" not in op or op.startswith("::") or op.endswith("::"):
        raise ValueError(f"splitting_ops entries must be operator names like 'vgc::attention' or "
                         f"'aten::scaled_dot_product_attention', got {op!r}")
    return op


def _check_inductor_options(name: str, options: Any) -> None:
    import torch._inductor.config as inductor_config

    if not isinstance(options, dict):
        raise ValueError(f"{name} must be a dict of Inductor options, got {type(options).__name__}")
    known = set(inductor_config.get_config_copy())
    for key in options:
        if key not in known:
            raise ValueError(f"{name}: unknown Inductor option {key!r} (see torch._inductor.list_options())")
