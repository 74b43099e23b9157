"""Named model sizes (BERT's, RoBERTa's, DistilBERT's and GPT-2's published shapes, a tiny Llama) as
TransformerConfig presets."""
from __future__ import annotations

import dataclasses

from jaxlm.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "bert-tiny": TransformerConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512),
    "bert-mini": TransformerConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "bert-base": TransformerConfig(),
    "bert-large": TransformerConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "roberta-base": TransformerConfig(
        vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
        pad_token_id=1, position_offset=2),
    "distilbert-base": TransformerConfig(num_layers=6, type_vocab_size=0),
    "gpt2-small": TransformerConfig(
        vocab_size=50257, max_position_embeddings=1024, type_vocab_size=0, layer_norm_eps=1e-5,
        activation="gelu_tanh"),
    "llama-tiny": TransformerConfig(
        vocab_size=32000, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688,
        max_position_embeddings=2048, type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0,
        layer_norm_eps=1e-5, position_embedding="rope", norm="rmsnorm", activation="swiglu", use_bias=False,
        tie_embeddings=False),
}


def model_config(preset: str | None = None, **overrides) -> TransformerConfig:
    """A preset with field overrides; unknown presets or fields raise with the valid names."""
    if preset is None:
        base = TransformerConfig()
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise ValueError(f"unknown model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    valid = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise ValueError(f"unknown model keys {unknown}; valid keys: preset, {', '.join(sorted(valid))}")
    return dataclasses.replace(base, **overrides)
