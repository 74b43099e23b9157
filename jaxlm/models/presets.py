"""Named model sizes (the published shapes of BERT, RoBERTa, ALBERT, DistilBERT, SpanBERT, GPT-2,
SmolLM2, TinyLlama-1.1B, T5 and BART, and a tiny Llama) as TransformerConfig presets."""
from __future__ import annotations

import dataclasses

from jaxlm.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "bert-tiny": TransformerConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512),
    "bert-mini": TransformerConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "bert-base": TransformerConfig(),
    "bert-large": TransformerConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "roberta-base": TransformerConfig(
        family="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
        pad_token_id=1, position_offset=2),
    "distilbert-base": TransformerConfig(family="distilbert", num_layers=6, type_vocab_size=0),
    "gpt2-small": TransformerConfig(
        family="gpt2", vocab_size=50257, max_position_embeddings=1024, type_vocab_size=0, layer_norm_eps=1e-5,
        activation="gelu_tanh"),
    "albert-base": TransformerConfig(
        family="albert", vocab_size=30000, embedding_size=128, activation="gelu_tanh", hidden_dropout=0.0,
        attention_dropout=0.0),
    "spanbert-base": TransformerConfig(family="spanbert", vocab_size=28996),
    "gpt2-medium": TransformerConfig(
        family="gpt2", vocab_size=50257, hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096,
        max_position_embeddings=1024, type_vocab_size=0, layer_norm_eps=1e-5, activation="gelu_tanh"),
    "smollm2-135m": TransformerConfig(
        family="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
        intermediate_size=1536, max_position_embeddings=8192, type_vocab_size=0, hidden_dropout=0.0,
        attention_dropout=0.0, layer_norm_eps=1e-5, position_embedding="rope", rope_theta=100000.0,
        norm="rmsnorm", activation="swiglu", use_bias=False, tie_embeddings=True),
    "t5-small": TransformerConfig(
        family="t5", vocab_size=32128, hidden_size=512, num_layers=6, num_heads=8, head_size=64,
        intermediate_size=2048, max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-6,
        position_embedding="relative", norm="rmsnorm", activation="relu", use_bias=False, activation_dropout=0.1,
        initializer_range=1.0, fan_in_init=True,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    "t5-base": TransformerConfig(
        family="t5", vocab_size=32128, hidden_size=768, num_layers=12, num_heads=12, head_size=64,
        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-6,
        position_embedding="relative", norm="rmsnorm", activation="relu", use_bias=False, activation_dropout=0.1,
        initializer_range=1.0, fan_in_init=True,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    "bart-base": TransformerConfig(
        family="bart", vocab_size=50265, num_layers=6, max_position_embeddings=1026, position_offset=2,
        type_vocab_size=0, layer_norm_eps=1e-5, activation_dropout=0.1, pad_token_id=1, eos_token_id=2,
        decoder_start_token_id=2),
    "llama-1b": TransformerConfig(  # TinyLlama-1.1B's shapes
        family="llama", vocab_size=32000, hidden_size=2048, num_layers=22, num_heads=32, num_kv_heads=4,
        intermediate_size=5632, max_position_embeddings=2048, type_vocab_size=0, hidden_dropout=0.0,
        attention_dropout=0.0, layer_norm_eps=1e-5, position_embedding="rope", norm="rmsnorm", activation="swiglu",
        use_bias=False, tie_embeddings=False),
    "llama-tiny": TransformerConfig(
        family="llama", vocab_size=32000, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688,
        max_position_embeddings=2048, type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0,
        layer_norm_eps=1e-5, position_embedding="rope", norm="rmsnorm", activation="swiglu", use_bias=False,
        tie_embeddings=False),
}


def model_config(preset: str | None = None, **overrides) -> TransformerConfig:
    """A preset with field overrides, validated; unknown presets, fields or families, and values
    `TransformerConfig.validate` refuses, raise ValueError naming them."""
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
    # here, not at the top: jaxlm.families imports the model modules, which this package's __init__ imports
    from jaxlm.families import get as family, names

    config = dataclasses.replace(base, **overrides)  # typed and validated as it is built
    spec = family(config.family)
    if config.position_embedding not in spec.positions:  # another was ignored: no positions, or T5's bias alone
        raise ValueError(f"model.position_embedding={config.position_embedding!r}: the {config.family} family's "
                         f"network reads {' or '.join(map(repr, spec.positions))} positions only; choose "
                         f"{'one of them' if len(spec.positions) > 1 else 'it'}")
    if config.embedding_size and not spec.factorised_embeddings:
        raise ValueError(f"model.embedding_size={config.embedding_size} narrows the token embeddings of "
                         f"{', '.join(names(factorised_embeddings=True))}; the {config.family} family's are "
                         "hidden_size wide: leave it at 0")
    return config
