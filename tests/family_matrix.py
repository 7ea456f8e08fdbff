"""Every decoder-only causal LM class of the installed transformers, tiny and random, through vgc's three paths for
`generate()`: the integration (`vgc.integrations.transformers.compile`), breakable graphs and the drop-in
(`torch.compile(model.forward, backend="vgc")`). Each path must give eager's tokens (fp32, greedy on a left-padded
batch of 3, an EOS reached mid-batch, seeded sampling) or refuse the model with a ValueError. Anything else (other
tokens, a crash) is a defect.

Used by `tests/integrations/test_family_matrix.py` (CI) and `tools/family_matrix.py` (the whole list, and the table
in docs/transformers.md). Classes are taken from transformers' auto mapping for causal LMs; a class is skipped, with
its reason, when it is not decoder-only, when no tiny config of it builds, or when eager generate() itself fails on
it.
"""

from __future__ import annotations

import copy
import inspect
import traceback

import torch

PATHS = ("compile", "breakable", "dropin")
# Tiny shapes, set under each config's own names (through its attribute_map) where the config has them.
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
            num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16,
            q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
            sliding_window=64, num_kv_heads=2)
PROMPTS = torch.tensor([[5, 17, 42, 8, 99, 3], [0, 0, 7, 8, 9, 10], [0, 0, 0, 0, 11, 12]])
MASK = (PROMPTS != 0).long()
NEW_TOKENS = 8
MAX_CACHE_LEN = 32   # the window above (64) never binds
MAX_PARAMETERS = 20_000_000
# Settings a family's config validates against the tiny shapes (one entry per layer).
FIXUPS = {"gpt_neo": {"attention_types": [[["global", "local"], 1]]}, "codegen": {"rotary_dim": 8},
          "gptj": {"rotary_dim": 8}}


def classes() -> list[tuple[str, str]]:
    """(model_type, class name) of every causal LM class in transformers' auto mapping, each class once (under the
    model type its name spells, where several types map to it: llama, not exaone, for LlamaForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    chosen: dict[str, str] = {}
    for model_type, name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        if name not in chosen or _spells(model_type, name) and not _spells(chosen[name], name):
            chosen[name] = model_type
    return sorted(((model_type, name) for name, model_type in chosen.items()), key=lambda pair: pair[1])


# Settings that switch a class to another attention than its default: a row of their own.
VARIANTS = [("falcon", "FalconForCausalLM", {"alibi": True})]


def cases() -> list[tuple[str, str, str, dict]]:
    """(row label, model_type, class name, config overrides): every class, then the VARIANTS."""
    rows = [(name, model_type, name, {}) for model_type, name in classes()]
    rows += [(f"{name} ({', '.join(f'{k}={v}' for k, v in extra.items())})", model_type, name, extra)
             for model_type, name, extra in VARIANTS]
    return rows


def _spells(model_type: str, name: str) -> bool:
    return model_type.replace("_", "").replace("-", "") in name.lower()


class Skip(Exception):
    """A class the matrix cannot run, and why."""


def build(model_type: str, class_name: str, **overrides) -> torch.nn.Module:
    """A tiny fp32 model of the class with weights drawn N(0, 0.2) (large: tokens depend on masks and positions);
    `overrides` are more config settings."""
    try:
        return _build(model_type, class_name, overrides)
    except Skip:
        raise
    except Exception as error:   # noqa: BLE001 - a config this generic builder cannot shrink: not vgc's to judge
        raise Skip(f"no tiny config builds ({type(error).__name__}: {_first_line(error)})") from error


def _build(model_type: str, class_name: str, overrides: dict) -> torch.nn.Module:
    import transformers
    from transformers import AutoConfig
    model_cls = getattr(transformers, class_name, None)
    if model_cls is None:
        raise Skip(f"{class_name} is not exported by transformers")
    try:
        defaults = AutoConfig.for_model(model_type)
    except Exception as error:   # noqa: BLE001
        raise Skip(f"no default config ({type(error).__name__})") from error
    if getattr(defaults, "is_encoder_decoder", False):
        raise Skip("encoder-decoder")
    if defaults.get_text_config() is not defaults:
        raise Skip("a composite (multimodal) config")
    attribute_map = getattr(type(defaults), "attribute_map", {}) or {}
    options = {}
    for key, value in TINY.items():
        native = attribute_map.get(key, key)
        if isinstance(getattr(type(defaults), native, None), property):   # derived from the others
            continue
        if hasattr(defaults, native) or hasattr(defaults, key):
            options[native] = value
    options.update(FIXUPS.get(model_type, {}), **overrides)
    layer_types = getattr(defaults, "layer_types", None)
    if layer_types:
        options["layer_types"] = list(layer_types[:TINY["num_hidden_layers"]])
    config = type(defaults)(**options)   # a failure here is a Skip (build())
    config.is_decoder = True
    with torch.device("meta"):   # sub-configs this does not reach keep their full size: count first
        size = sum(p.numel() for p in model_cls(config).parameters())
    if size > MAX_PARAMETERS:
        raise Skip(f"{size / 1e6:.0f}M parameters at the tiny settings (sub-configs they do not reach)")
    torch.manual_seed(0)
    model = model_cls(config).eval()
    if not hasattr(model, "generate") or not {"past_key_values", "cache"} & set(
            inspect.signature(model.forward).parameters):
        raise Skip("no generate() with a KV cache")
    large_weights(model)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def large_weights(model: torch.nn.Module, seed: int | None = None) -> torch.nn.Module:
    """Draw every matrix of `model` N(0, 0.2) in place (from `seed` when given) and return it in eval mode."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0, 0.2)
    return model.eval()


def requests(reference: torch.nn.Module) -> list[dict]:
    """generate() keywords of the three requests: greedy, greedy with an EOS reached mid-batch, seeded sampling.
    The EOS is a token eager's greedy output reaches in row 0 after a few steps."""
    greedy = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    tokens = generate(reference, greedy)
    eos = int(tokens[0, PROMPTS.shape[1] + NEW_TOKENS // 2])
    return [greedy, dict(greedy, eos_token_id=eos),
            dict(max_new_tokens=NEW_TOKENS, do_sample=True, top_k=20, temperature=1.5, seed=1234)]


def generate(model, request: dict) -> torch.Tensor:
    request = dict(request)
    seed = request.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(PROMPTS, attention_mask=MASK, pad_token_id=0, **request)


def prepare(path: str, model: torch.nn.Module, piece_backend: str) -> None:
    """Put `model` on `path`; raises ValueError when the path refuses it."""
    from vgc.integrations import transformers as vgc_transformers
    if path == "compile":
        vgc_transformers.compile(model, max_batch_size=4, max_cache_len=MAX_CACHE_LEN,
                                 config={"piece_backend": piece_backend})
        model.vgc.warmup()
    elif path == "breakable":
        vgc_transformers.breakable(model, batch_sizes=[3])
    else:
        model.forward = torch.compile(model.forward, backend="vgc", options={"piece_backend": piece_backend})


def run(model_type: str, class_name: str, paths=PATHS, piece_backend: str = "eager", **overrides) -> dict[str, str]:
    """{path: outcome} for one class: "equal", "refused: <reason>", "DIFFERENT: <request>" or "FAILED: <error>";
    or {"skipped": reason}."""
    try:
        reference = build(model_type, class_name, **overrides)
    except Skip as skip:
        return {"skipped": str(skip)}
    return compare(reference, paths, piece_backend)


def compare(reference: torch.nn.Module, paths=PATHS, piece_backend: str = "eager") -> dict[str, str]:
    """{path: outcome} for copies of `reference` on each path, against its own tokens (see `run`)."""
    torch._dynamo.reset()
    try:
        wanted = [(request, generate(reference, request)) for request in requests(reference)]
    except Exception as error:   # noqa: BLE001
        return {"skipped": f"eager generate() fails ({type(error).__name__}: {_first_line(error)})"}
    outcomes = {}
    for path in paths:
        model = copy.deepcopy(reference)
        try:
            prepare(path, model, piece_backend)
        except ValueError as refusal:
            outcomes[path] = f"refused: {_first_line(refusal)}"
            continue
        except Exception as error:   # noqa: BLE001
            outcomes[path] = f"FAILED at prepare: {type(error).__name__}: {_first_line(error)}"
            continue
        outcome = "equal"
        for index, (request, want) in enumerate(wanted):
            try:
                got = generate(model, request)
            except ValueError as refusal:   # a clear refusal of the request, not of the model
                outcome = f"refused: {_first_line(refusal)}"
                break
            except Exception as error:   # noqa: BLE001
                outcome = f"FAILED: {type(error).__name__}: {_first_line(error)}\n{traceback.format_exc()}"
                break
            if not torch.equal(got, want):
                outcome = f"DIFFERENT tokens on request {index} ({request})"
                break
        outcomes[path] = outcome
        del model
    return outcomes


def ok(outcome: str) -> bool:
    return outcome == "equal" or outcome.startswith("refused")


def failed(outcomes: dict[str, str]) -> bool:
    """Whether any path of one class's outcomes gave other tokens or crashed."""
    return any(not ok(outcomes[path]) for path in PATHS if path in outcomes)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""
