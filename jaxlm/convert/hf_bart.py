"""Hugging Face BART checkpoints <-> jaxlm BART: config, tensor names, layouts and shape checks."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlm.convert.hf import (build_config, check_family, check_representable, hf_id, param_shapes,
                              read_config, read_tensors, special_id)
from jaxlm.convert.names import (Entry, attention, dense, encoder_layer, norm, params_from_hf, params_to_hf,
                                 prefixed)
from jaxlm.models.bart import BartForConditionalGeneration
from jaxlm.models.config import TransformerConfig

SHARED = "model.shared.weight"
# Hugging Face keeps the one token table under three more names.
TIED = {copy: SHARED for copy in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                                  "lm_head.weight")}
LOGITS_BIAS = "final_logits_bias"
ARCHITECTURE = "BartForConditionalGeneration"
# What our config must say for a Hugging Face BART to hold the network.
REPRESENTABLE = dict(family="bart", position_offset=2, position_embedding="learned", norm="layernorm",
                     activation="gelu", use_bias=True, tie_embeddings=True, layer_norm_eps=1e-5)
ENCODER_LAYER_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                       "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm")
# Flags of older or related (mBART, Marian) configs that this network cannot reproduce when set.
UNSUPPORTED_FLAGS = {
    "normalize_before": "pre-LN layers (mBART-style)",
    "add_final_layer_norm": "a final LayerNorm after each stack (mBART-style)",
    "scale_embedding": "token embeddings scaled by sqrt(d_model)",
    "static_position_embeddings": "sinusoidal position embeddings",
    "add_bias_logits": "a bias inside the LM head",
}


# ---------------------------------------------------------------- config

def bart_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face BART config.json dict; `overrides` win (e.g. dtype).

    Hugging Face's `max_position_embeddings` counts positions; ours is the table size (+ offset 2).
    Layer drop is a training-time setting with no field here and is dropped.
    """
    check_family(config, "bart", "Bart")
    activation = config.get("activation_function", "gelu")
    if activation != "gelu":
        raise ValueError(f"activation_function={activation!r} is not supported: jaxlm BART uses exact (erf) 'gelu'")
    for flag, meaning in UNSUPPORTED_FLAGS.items():
        if config.get(flag):
            raise ValueError(f"{flag}=True ({meaning}) is not supported by jaxlm BART")
    if not config.get("normalize_embedding", True):
        raise ValueError("normalize_embedding=False is not supported: jaxlm BART always has layernorm_embedding")
    if not config.get("tie_word_embeddings", True):
        raise ValueError("tie_word_embeddings=False is not supported: jaxlm BART ties lm_head to the shared embeddings")
    shared = {"num_heads": ("encoder_attention_heads", "decoder_attention_heads", 16),
              "intermediate_size": ("encoder_ffn_dim", "decoder_ffn_dim", 4096)}
    for ours, (encoder, decoder, default) in shared.items():
        if config.get(encoder, default) != config.get(decoder, default):
            raise ValueError(f"{encoder}={config.get(encoder, default)} differs from {decoder}="
                             f"{config.get(decoder, default)}: jaxlm BART uses one model.{ours} for both stacks")
    encoder_layers, decoder_layers = config.get("encoder_layers", 12), config.get("decoder_layers", 12)
    start = config.get("decoder_start_token_id")
    fields = dict(
        family="bart", vocab_size=config.get("vocab_size", 50265), hidden_size=config.get("d_model", 1024),
        num_layers=encoder_layers, num_decoder_layers=0 if decoder_layers == encoder_layers else decoder_layers,
        num_heads=config.get("encoder_attention_heads", 16), intermediate_size=config.get("encoder_ffn_dim", 4096),
        max_position_embeddings=config.get("max_position_embeddings", 1024) + 2, position_offset=2,
        type_vocab_size=0, hidden_dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        activation_dropout=config.get("activation_dropout", 0.0),
        layer_norm_eps=1e-5, initializer_range=config.get("init_std", 0.02), activation="gelu",
        tie_embeddings=True, pad_token_id=config.get("pad_token_id", 1),
        eos_token_id=special_id(config, "eos_token_id", 2), decoder_start_token_id=2 if start is None else start)
    return build_config(fields, overrides)


def bart_config_to_hf(config: TransformerConfig) -> dict:
    """A config.json dict for transformers' BartForConditionalGeneration."""
    check_representable(config, "BART", **REPRESENTABLE)
    eos = hf_id(config.eos_token_id)
    return {
        "architectures": [ARCHITECTURE], "model_type": "bart", "vocab_size": config.vocab_size,
        "d_model": config.hidden_size, "encoder_layers": config.num_layers, "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.intermediate_size, "decoder_ffn_dim": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings - config.position_offset,
        "activation_function": "gelu", "dropout": config.hidden_dropout, "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "init_std": config.initializer_range, "scale_embedding": False, "tie_word_embeddings": True,
        "is_encoder_decoder": True, "pad_token_id": config.pad_token_id, "eos_token_id": eos,
        "forced_eos_token_id": eos, "decoder_start_token_id": config.decoder_start_token_id,
    }


# ---------------------------------------------------------------- name map

def _attention(ours: str, theirs: str) -> list[Entry]:
    return attention(ours, [f"{theirs}.{n}" for n in ("q_proj", "k_proj", "v_proj", "out_proj")])


def _decoder_layer(i: int) -> list[Entry]:
    ours, theirs = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
    return [
        *_attention(f"{ours}/attention", f"{theirs}.self_attn"),
        *norm(f"{ours}/attention_norm", f"{theirs}.self_attn_layer_norm"),
        *_attention(f"{ours}/cross_attention", f"{theirs}.encoder_attn"),
        *norm(f"{ours}/cross_attention_norm", f"{theirs}.encoder_attn_layer_norm"),
        *dense(f"{ours}/mlp/intermediate", f"{theirs}.fc1"),
        *dense(f"{ours}/mlp/output", f"{theirs}.fc2"),
        *norm(f"{ours}/mlp_norm", f"{theirs}.final_layer_norm"),
    ]


def _embeddings(stack: str) -> list[Entry]:
    return [Entry(f"{stack}/embeddings/position/embedding", f"model.{stack}.embed_positions.weight"),
            *norm(f"{stack}/embeddings/norm", f"model.{stack}.layernorm_embedding")]


def bart_name_map(config: TransformerConfig) -> dict[str, list[Entry]]:
    """Group -> entries of BartForConditionalGeneration; `final_logits_bias` [1, V] is optional."""
    return {
        "model": [Entry("shared/embedding", SHARED), *_embeddings("encoder"),
                  *(e for i in range(config.num_layers)
                    for e in encoder_layer(f"encoder/layer_{i}", f"model.encoder.layers.{i}", ENCODER_LAYER_NAMES)),
                  *_embeddings("decoder"),
                  *(e for i in range(config.decoder_layers) for e in _decoder_layer(i))],
        "logits_bias": [Entry("final_logits_bias", LOGITS_BIAS, "row")],
    }


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our BART (no allocation)."""
    return param_shapes(BartForConditionalGeneration, config, 2)


# ---------------------------------------------------------------- both ways

def bart_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> dict:
    """Our parameter tree (plain float32 numpy; scan layout when `config.scan_layers`) from HF BART
    tensors, with or without the `model.` prefix.

    Of `model.shared.weight` and its tied copies (the encoder's and decoder's `embed_tokens`, `lm_head`)
    those present must be equal, and any stands for the others. `final_logits_bias` may be absent
    (zeros, as Hugging Face does)."""
    shapes = expected_shapes(config)
    tensors = prefixed(tensors, "model.", (LOGITS_BIAS, "lm_head.weight"))  # a bare BartModel's lack `model.`
    params = params_from_hf(tensors, config, bart_name_map(config), shapes, "BART", tied=TIED)
    params.setdefault("final_logits_bias", np.zeros(shapes["final_logits_bias"], np.float32))
    return params


def load_hf_bart(model_dir, **config_overrides) -> tuple[TransformerConfig, dict]:
    """(config, parameter tree) of a Hugging Face BART checkpoint directory."""
    config = bart_config_from_hf(read_config(model_dir), **config_overrides)
    return config, bart_params_from_hf(read_tensors(model_dir), config)


def bart_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF BartForConditionalGeneration tensors from our tree (boxed or plain, with or without
    `params`, loop or scan layout as `config.scan_layers` says), the tied copies included."""
    check_representable(config, "BART", **REPRESENTABLE)
    return params_to_hf(params, config, bart_name_map(config), expected_shapes(config), "BART", tied=TIED)
