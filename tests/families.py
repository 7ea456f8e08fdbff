"""Tiny random-weight configs of 20 transformers families, unmodified, for the generality tests.

Each family gives a `Family`: the model behind the one-tensor entry point a user would write, `make_inputs(n)`
for a dynamic size n (sequence length, audio length or batch, per family) and the `dynamic_arg_dims` that size
lives at. Configs are as small as each family allows (one or two layers, hidden size 32) so that the three ways of
compiling each of them stay within the suite's budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import transformers as T

VOCAB = 128


class Entry(torch.nn.Module):
    """`model(**inputs)` reduced to the one tensor a server would use."""

    def __init__(self, model: torch.nn.Module, output: str):
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, **inputs):
        return getattr(self.model(**inputs, return_dict=True), self.output)


@dataclass
class Family:
    name: str
    build: Callable[[], torch.nn.Module]
    make_inputs: Callable[[int], dict[str, torch.Tensor]]
    dynamic: dict[str, Any]       # dynamic_arg_dims of the entry point (its inputs are **inputs)
    sizes: tuple[int, ...]        # sizes checked against eager, across the family's size conditions if it has any
    max_size: int                 # compile_ranges_max_size
    ranges: int = 1               # the fewest compile ranges its size conditions give (windows, convolutions)


def _text(n: int, batch: int = 2) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(1, VOCAB, (batch, n), generator=torch.Generator().manual_seed(n))}


def _seq2seq(n: int) -> dict[str, torch.Tensor]:
    ids = _text(n)["input_ids"]
    return {"input_ids": ids, "decoder_input_ids": ids.flip(1)}


def _pixels(size: int, channels: int = 3) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda n: {"pixel_values": torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(n))}


def _decoder(config_class, model_class, attention: str = "sdpa", **extra) -> Callable[[], torch.nn.Module]:
    def build():
        config = config_class(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                              pad_token_id=0, attn_implementation=attention, **extra)
        return Entry(model_class(config), "last_hidden_state")
    return build


def _built(factory: Callable[[], torch.nn.Module], output: str = "last_hidden_state"):
    return lambda: Entry(factory(), output)


TEXT = {"inputs": {"*": 1}}    # dim 1 (tokens) of every input
BATCH = {"inputs": {"*": 0}}   # dim 0 (images) of every input
TEXT_SIZES = (5, 12)           # both sides of the 8-token sliding windows below

FAMILIES = [
    Family("llama", _decoder(T.LlamaConfig, T.LlamaModel), _text, TEXT, TEXT_SIZES, 32),
    Family("qwen2", _decoder(T.Qwen2Config, T.Qwen2Model), _text, TEXT, TEXT_SIZES, 32),
    Family("mistral", _decoder(T.MistralConfig, T.MistralModel, sliding_window=8), _text, TEXT, TEXT_SIZES, 32,
           2),
    # Soft-capping: transformers runs Gemma2 on its eager attention only, so split at SDPA has nothing to split at.
    Family("gemma2", _decoder(T.Gemma2Config, T.Gemma2Model, "eager", head_dim=8, sliding_window=8), _text, TEXT,
           TEXT_SIZES, 32, 2),
    Family("gemma3", _decoder(T.Gemma3TextConfig, T.Gemma3TextModel, head_dim=8, sliding_window=8,
                              layer_types=["sliding_attention"]), _text, TEXT, TEXT_SIZES, 32, 2),
    Family("phi3", _decoder(T.Phi3Config, T.Phi3Model), _text, TEXT, TEXT_SIZES, 32),
    Family("mixtral", _decoder(T.MixtralConfig, T.MixtralModel, num_local_experts=4, num_experts_per_tok=2),
           _text, TEXT, TEXT_SIZES, 32),
    Family("qwen2_moe", _decoder(T.Qwen2MoeConfig, T.Qwen2MoeModel, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=32, shared_expert_intermediate_size=32), _text, TEXT,
           TEXT_SIZES, 32),
    Family("qwen3_moe", _decoder(T.Qwen3MoeConfig, T.Qwen3MoeModel, head_dim=8, num_experts=4,
                                 num_experts_per_tok=2, moe_intermediate_size=32), _text, TEXT, TEXT_SIZES, 32),
    Family("gpt2", _built(lambda: T.GPT2Model(T.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=256, attn_implementation="sdpa"))),
        _text, TEXT, TEXT_SIZES, 32),
    Family("bert", _built(lambda: T.BertModel(T.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=256, attn_implementation="sdpa"))), _text, TEXT, TEXT_SIZES, 32),
    Family("modernbert", _built(lambda: T.ModernBertModel(T.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=256, global_attn_every_n_layers=2, local_attention=8, pad_token_id=0,
        attn_implementation="sdpa"))), _text, TEXT, (3, 12), 32, 2),
    Family("t5", _built(lambda: T.T5Model(T.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, decoder_start_token_id=0))),
        _seq2seq, TEXT, TEXT_SIZES, 32),
    Family("bart", _built(lambda: T.BartModel(T.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
        attn_implementation="sdpa"))), _seq2seq, TEXT, TEXT_SIZES, 32),
    Family("whisper", _built(lambda: T.WhisperModel(T.WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=16, max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, attn_implementation="sdpa"))),
        lambda n: {"input_features": torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0)),
                   "decoder_input_ids": _text(n)["input_ids"]},
        {"inputs": {"decoder_input_ids": 1}}, TEXT_SIZES, 32),
    Family("vit", _built(lambda: T.ViTModel(T.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=16,
        patch_size=4, attn_implementation="sdpa"))), _pixels(16), BATCH, (2, 3), 8),
    Family("clip", _built(lambda: T.CLIPModel(T.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                           image_size=16, patch_size=4), projection_dim=16, attn_implementation="sdpa")),
        "logits_per_image"),
        lambda n: {"input_ids": _text(n)["input_ids"], **_pixels(16)(2)}, {"inputs": {"input_ids": 1}},
        TEXT_SIZES, 32),
    Family("siglip", _built(lambda: T.SiglipVisionModel(T.SiglipVisionConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=16,
        patch_size=4, attn_implementation="sdpa"))), _pixels(16), BATCH, (2, 3), 8),
    Family("swin", _built(lambda: T.SwinModel(T.SwinConfig(
        image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2,
        attn_implementation="sdpa"))), _pixels(16), BATCH, (2, 3), 8),
    Family("wav2vec2", _built(lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        attn_implementation="sdpa"))),
        lambda n: {"input_values": torch.randn(2, 10 * n, generator=torch.Generator().manual_seed(n))},
        {"inputs": {"input_values": 1}}, (2, 12), 64, 2),
]
