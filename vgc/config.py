"""`CompilationConfig`: every option a user can give vgc, checked once at construction.

Each field is declared once, beside its facts: a one-line doc, a check that normalises the value or raises a
`ValueError` naming the fix, whether it enters the cache hash and whether it does anything yet. Validation,
`hash_factors()` and the table in docs/config.md all read those declarations, so they cannot drift apart. The
hash covers only fields that change the code Inductor generates: one cache entry serves every CUDA-graph mode,
capture list, cache location and save format.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from vgc import _compat
from vgc.passes import BUILTIN_PASSES
from vgc.passes.manager import pass_manager, user_identity


class CUDAGraphMode(enum.Enum):
    NONE = "none"
    PIECEWISE = "piecewise"
    FULL = "full"
    FULL_AND_PIECEWISE = "full_and_piecewise"

    # What each mode means, said once: every owner of graphs asks these, never the mode's name.
    @property
    def has_full(self) -> bool:
        """Calls that qualify (uniform decode, a capture size) replay one graph of the whole call."""
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE)

    @property
    def has_piecewise(self) -> bool:
        """Compiled pieces replay their own graphs between eager attention calls (under FULL_AND_PIECEWISE: the
        calls FULL graphs do not serve)."""
        return self in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)


class DynamicShapesType(enum.Enum):
    BACKED = "backed"
    UNBACKED = "unbacked"
    BACKED_SIZE_OBLIVIOUS = "backed_size_oblivious"


class PieceBackend(enum.Enum):
    INDUCTOR = "inductor"
    EAGER = "eager"


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


# --- Checks. Each takes (value, field name), returns the normalised value or raises a ValueError that names the
# field, the bad value and what is accepted.

def _is_int_at_least(value: Any, minimum: int) -> bool:
    # bool is an int subclass, but True as a size is always a mistake
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _ints_wording(minimum: int, plural: bool) -> str:
    if minimum == 1:
        return "positive ints" if plural else "a positive int"
    return f"ints >= {minimum}" if plural else f"an int >= {minimum}"


def _int_at_least(minimum: int, *, none_ok: bool = False) -> Callable[[Any, str], Any]:
    expected = ("None or " if none_ok else "") + _ints_wording(minimum, plural=False)

    def check(value: Any, name: str) -> int | None:
        if (none_ok and value is None) or _is_int_at_least(value, minimum):
            return value
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return check


def _sorted_ints(minimum: int) -> Callable[[Any, str], list[int]]:
    """A list of ints >= minimum, kept sorted and without repeats so equal lists hash alike."""
    def check(value: Any, name: str) -> list[int]:
        values = _as_list(value, name)
        for v in values:
            if not _is_int_at_least(v, minimum):
                raise ValueError(f"{name} must be {_ints_wording(minimum, plural=True)}, got {v!r}")
        return sorted(set(values))
    return check


def _optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda value, name: None if value is None else check(value, name)


def _enum(enum_cls: type[enum.Enum]) -> Callable[[Any, str], Any]:
    return lambda value, name: parse_enum(enum_cls, value, name)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _path(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a path string or None, got {value!r}")
    return value


def _positive_number(value: Any, name: str) -> float | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"{name} must be None or a positive number, got {value!r}")


def _as_list(value: Any, name: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"{name} must be a list, got {type(value).__name__} {value!r}")


# vgc's own attention ops: paged decoder attention and packed variable-length (vision encoder) attention.
DEFAULT_SPLITTING_OPS = ("vgc::attention", "vgc::varlen_attention")


def _splitting_ops(value: Any, name: str) -> list[str]:
    if value is None:
        return list(DEFAULT_SPLITTING_OPS)
    ops = _as_list(value, name)
    for op in ops:
        if not isinstance(op, str) or "::" not in op or op.startswith("::") or op.endswith("::"):
            raise ValueError(f"{name} entries must be operator names like 'vgc::attention' or "
                             f"'aten::scaled_dot_product_attention', got {op!r}")
    return ops


def _inductor_options(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of Inductor options, got {type(value).__name__}")
    known = _compat.inductor_option_names() if value else set()   # the default config needs no torch lookup
    for key in value:
        if key not in known:
            raise ValueError(f"{name}: unknown Inductor option {key!r} (see torch._inductor.list_options())")
    return value


def _pass_config(value: Any, name: str) -> dict[str, bool]:
    """Switches of vgc's built-in graph passes, by name; resolved to every pass's setting (defaults filled in)."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of pass name -> True/False, got {type(value).__name__}")
    unknown = sorted(set(value) - set(BUILTIN_PASSES))
    if unknown:
        raise ValueError(f"{name}: unknown graph pass(es) {unknown}; vgc's passes are {sorted(BUILTIN_PASSES)}")
    for key, switch in value.items():
        _bool(switch, f"{name}[{key!r}]")
    return {key: value.get(key, builtin.default) for key, builtin in BUILTIN_PASSES.items()}


def _inductor_passes(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of name -> pass (a torch CustomGraphPass, or a callable with a "
                         f"uuid() method), got {type(value).__name__}")
    for key, user_pass in value.items():
        if not isinstance(key, str):
            raise ValueError(f"{name} keys must be pass names (str), got {key!r}")
        user_identity(key, user_pass)   # raises, naming the pass, when it has no uuid()
    return dict(value)


def _dynamic_shapes(value: Any, name: str) -> DynamicShapesConfig:
    if isinstance(value, DynamicShapesConfig):
        return value
    if isinstance(value, (str, DynamicShapesType)):
        return DynamicShapesConfig(type=value)
    if isinstance(value, dict):
        return DynamicShapesConfig(**value)
    accepted = ", ".join(repr(m.value) for m in DynamicShapesType)
    raise ValueError(f"{name} must be a DynamicShapesConfig, a dict or one of {accepted}, got {value!r}")


# --- The field table.

@dataclass(frozen=True)
class FieldSpec:
    """What `CompilationConfig` knows about one of its fields, besides its type and default."""

    doc: str
    check: Callable[[Any, str], Any]
    # In the hash only if it changes the code Inductor generates; a field that changes where the code is stored
    # or how it is replayed would split the cache for nothing. "unless default": a later field, in the hash only
    # when set otherwise, so that every entry keyed before it existed keeps its key.
    in_hash: bool | str


def _field(doc: str, check: Callable[[Any, str], Any], *, in_hash: bool | str,
           default: Any = None, factory: Callable[[], Any] | None = None) -> Any:
    metadata = {"vgc": FieldSpec(doc, check, in_hash)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _spec(f: dataclasses.Field) -> FieldSpec:
    return f.metadata["vgc"]


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@dataclass
class CompilationConfig:
    """How vgc compiles a model. Every field is checked and normalised at construction; the fields, their
    defaults and whether each enters the cache hash are listed in docs/config.md."""

    splitting_ops: list[str] | None = _field(
        "Operators the graph is split at; each runs eagerly between compiled pieces. None means "
        "vgc's attention ops, `['vgc::attention', 'vgc::varlen_attention']`, and SDPA in a graph where it reads more "
        "keys than queries (a KV cache); `[]` gives one piece.", _splitting_ops, in_hash=True)
    compile_sizes: list[int] = _field(
        "Sizes of the dynamic dimension that get a static-size Inductor artifact besides the symbolic-size one.",
        _sorted_ints(1), in_hash=True, factory=list)
    inductor_compile_config: dict[str, Any] = _field(
        "Inductor options for every artifact; unknown option names are errors.",
        _inductor_options, in_hash=True, factory=dict)
    compile_sizes_inductor_config: dict[str, Any] = _field(
        "Inductor options added for the `compile_sizes` artifacts only: tuning that pays at one fixed size "
        "(coordinate descent turns an M=1 matmul into a fusable reduction) without slowing the symbolic-size code.",
        _inductor_options, in_hash=True, factory=dict)
    cudagraph_mode: CUDAGraphMode | None = _field(
        "`none`, `piecewise`, `full` or `full_and_piecewise`; None means `piecewise` on CUDA, `none` elsewhere.",
        _optional(_enum(CUDAGraphMode)), in_hash=False)
    cudagraph_capture_sizes: list[int] | None = _field(
        "Sizes to capture CUDA graphs at; None means 1, 2, 4 and every multiple of 8 up to "
        "`max_cudagraph_capture_size`.", _optional(_sorted_ints(1)), in_hash=False)
    max_cudagraph_capture_size: int = _field(
        "Largest capture size: larger `cudagraph_capture_sizes` entries are dropped.",
        _int_at_least(1), in_hash=False, default=512)
    cudagraph_memory_budget_mb: float | None = _field(
        "Most device memory (MiB) the CUDA graphs' pool may grow by at capture: sizes are captured largest first, "
        "a size whose graph would pass the budget (or that runs out of memory) is skipped and its calls pad to a "
        "larger one or run without a graph; None: no limit.", _positive_number, in_hash=False)
    cudagraph_traffic_profile: str | None = _field(
        "A traffic profile recorded by `vgc.compile(..., record=PATH)` (or the encoder manager's `record=`): "
        "without `cudagraph_capture_sizes` (or `encoder_cudagraph_token_budgets`), the sizes to capture are those "
        "that minimise the profile's padded tokens (`vgc profile show PATH`).", _path, in_hash=False)
    cudagraph_max_graphs: int = _field(
        "With a traffic profile: the most capture sizes (decoder) or token budgets per path (encoder) it chooses.",
        _int_at_least(1), in_hash=False, default=16)
    uniform_decode_query_len: int = _field(
        "Tokens per sequence in a uniform decode batch: 1, or 1 + k with k speculative (draft) tokens. FULL graphs "
        "are captured at the capture sizes that are multiples of it, and a uniform decode call pads each input "
        "to the extents its FULL graph was captured with (tokens and sequences alike).", _int_at_least(1),
        in_hash=False, default=1)
    compile_ranges_max_size: int = _field(
        "`vgc.compile` compile ranges: `warmup(make_inputs)` covers the sizes 2 up to this one. Where the model's "
        "size conditions (a branch on a dynamic size, a window, a bound in Inductor's code) split them, each side "
        "gets its own trace and artifacts, and each call runs on the range whose conditions it meets. 0: one trace; "
        "a call on the other side of a condition raises InputMismatchError.", _int_at_least(0), in_hash=False,
        default=0)
    dynamic_shapes_config: DynamicShapesConfig = _field(
        "How `vgc.compile` treats dynamic sizes: `backed`, `unbacked` or `backed_size_oblivious` "
        "(a string, a dict or a `DynamicShapesConfig`).", _dynamic_shapes, in_hash=True, factory=DynamicShapesConfig)
    cache_dir: str | None = _field(
        "Cache root; None means `$VGC_CACHE_ROOT`, else `~/.cache/vgc`.", _path, in_hash=False)
    compile_cache_save_format: CompileCacheSaveFormat | None = _field(
        "`binary` or `unpacked` (keeps Inductor's generated code readable); None means "
        "`$VGC_COMPILE_CACHE_SAVE_FORMAT`, else `binary`.", _optional(_enum(CompileCacheSaveFormat)), in_hash=False)
    cudagraph_mm_encoder: bool = _field(
        "`vgc.encoder.EncoderCudaGraphManager` captures the encoder's forward as CUDA graphs at token budgets "
        "(off: the same packing runs the compiled forward without graphs).",
        _bool, in_hash=False, default=False)
    encoder_cudagraph_token_budgets: list[int] = _field(
        "Encoder CUDA graphs: the token budgets to capture at; empty means levels from the model's range, each at "
        "most 1.25x the one before (padding <= ~20%), the largest always included.",
        _sorted_ints(1), in_hash=False, factory=list)
    encoder_cudagraph_max_vision_items_per_batch: int = _field(
        "Encoder CUDA graphs: the most images or videos in one sub-batch; 0 means largest budget // the manager's "
        "min_budget.",
        _int_at_least(0), in_hash=False, default=0)
    encoder_cudagraph_max_frames_per_batch: int | None = _field(
        "Encoder CUDA graphs: the most attention sequences (video frames; an image is one) in one sub-batch; "
        "None or 0 means the items, or more where videos may bring more frames, up to largest budget // min_budget.",
        _int_at_least(0, none_ok=True), in_hash=False)
    pass_config: dict[str, bool] = _field(
        "vgc's graph passes, switched by name: 'eliminate_noops' (inside Inductor, per piece), "
        "'fuse_sibling_matmuls' (linears sharing an input become one, over their weights concatenated once) and "
        "'skinny_matmuls' (on: bf16/fp16 CUDA matmuls of one row run vgc's Triton GEMV, launched as a "
        "programmatic dependent on Hopper; 1.13x at batch-1 decode on an H200) and 'skinny_matmul_fusion' (on: "
        "those GEMVs also take the residual add, RMSNorm and SiLU-and-multiply around them; 1.12x more at batch-1 "
        "decode on an H100, 185 -> 138 kernels) and 'skinny_matmul_rope' (on: q and k's rotary embedding in the "
        "fused qkv GEMV too, as vgc's Llama or transformers spell it; 1.03x more, 138 -> 108 kernels) and "
        "'outer_products' (on: a matmul whose inner dim is 1, such as transformers' rotary angles, as a multiply "
        "that fuses into its neighbours; the same numbers, fp32 ones kept as matmuls where their device's matmuls "
        "round fp32 inputs: TF32, oneDNN's bf16); "
        "unnamed passes keep their default (see docs/architecture.md#graph-passes-vgcpasses).", _pass_config, in_hash=True, factory=dict)
    inductor_passes: dict[str, Any] = _field(
        "The user's graph passes, by name: torch `CustomGraphPass` objects or callables with a `uuid()`; run after "
        "vgc's on every compiled piece, their uuids in the cache hash.", _inductor_passes, in_hash=True, factory=dict)
    debug: bool = _field(
        "CUDA graphs: rerun the first graphed call at each padded size (`vgc.compile`) or at each FULL graph's call "
        "shape (drop-in), and one in 100 after it, without graphs, and raise if the replay differs.", _bool,
        in_hash=False, default=False)

    piece_backend: PieceBackend = _field(
        "What runs the pieces between splitting ops: `inductor` (compiled per piece, cached) or `eager` (the "
        "piece's own graph, with no Inductor call: capture, split, saved traces and CUDA graphs stay; cold starts "
        "cost a trace, not a compile; `compile_sizes` and Inductor options do nothing).",
        _enum(PieceBackend), in_hash="unless default", default=PieceBackend.INDUCTOR)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            setattr(self, f.name, _spec(f).check(getattr(self, f.name), f.name))
        if "post_grad_custom_post_pass" in self.inductor_compile_config and (
                self.inductor_passes or pass_manager(self.pass_config, {}) is not None):
            raise ValueError("inductor_compile_config['post_grad_custom_post_pass'] is where vgc runs its graph "
                             "passes: put that pass in inductor_passes={'<name>': pass} instead")

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> "CompilationConfig":
        """Build a config from `torch.compile(..., options={...})`; unknown keys are errors."""
        options = dict(options or {})
        problem = _unknown_fields(options, "options")
        if problem:
            raise ValueError(f"unknown vgc option(s) {problem}")
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
        return {f.name: _normalize(getattr(self, f.name)) for f in dataclasses.fields(self) if _spec(f).in_hash is True
                or (_spec(f).in_hash and getattr(self, f.name) != _default(f))}

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


def config_fields_markdown() -> str:
    """The field table of docs/config.md, generated from the declarations above."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| field | type | default | in cache hash | what it does |",
            "|---|---|---|---|---|"]
    for f in dataclasses.fields(CompilationConfig):
        spec = _spec(f)
        rows.append(f"| `{f.name}` | `{cell(str(f.type))}` | `{cell(repr(_normalize(_default(f))))}` | "
                    f"{'yes' if spec.in_hash is True else f'yes, {spec.in_hash}' if spec.in_hash else 'no'} | {cell(spec.doc)} |")
    return "\n".join(rows) + "\n"


def _unknown_fields(given, what: str) -> str:
    """'' when every name in `given` is a CompilationConfig field, else the unknown ones, close names and the
    accepted ones."""
    import difflib

    known = [f.name for f in dataclasses.fields(CompilationConfig)]
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return ""
    close = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
    hints = "; ".join(f"did you mean {c[0]!r} for {name!r}?" for name, c in close.items() if c)
    return f"{unknown}{' (' + hints + ')' if hints else ''}; accepted {what} are {sorted(known)}"


_dataclass_init = CompilationConfig.__init__


def _init(self, *args, **kwargs):
    problem = _unknown_fields(kwargs, "fields")
    if problem:   # the dataclass's own TypeError names the first unknown keyword only, and no accepted one
        raise TypeError(f"CompilationConfig got unknown field(s) {problem}")
    _dataclass_init(self, *args, **kwargs)


CompilationConfig.__init__ = _init
_init.__doc__, _init.__wrapped__ = _dataclass_init.__doc__, _dataclass_init

