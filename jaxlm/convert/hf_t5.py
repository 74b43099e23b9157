"""Hugging Face T5 checkpoints <-> jaxlm T5: config, tensor names, layouts and shape checks."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlm.convert.hf import build_config, check_family, check_representable, hf_id, param_shapes, special_id
from jaxlm.convert.names import Entry, attention, dense, fold_copies, params_from_hf, params_to_hf
from jaxlm.models.config import TransformerConfig
from jaxlm.models.t5 import T5ForConditionalGeneration

SHARED, LM_HEAD = "shared.weight", "lm_head.weight"
EMBED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# An unused table transformers creates but never reads.
IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)
FEED_FORWARD = {"relu": "relu", "gated-gelu": "geglu"}


# ---------------------------------------------------------------- config

def t5_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face T5 config.json dict; `overrides` win (e.g. dtype).

    `tie_embeddings` means the v1.0 head (tied and rescaled). transformers >= 5 writes
    `tie_word_embeddings=True` for every T5 and keeps that distinction in `scale_decoder_outputs`;
    older files (the hub's) say `tie_word_embeddings=False` for v1.1. Both are read.
    """
    check_family(config, "t5", "T5")
    projection = config.get("feed_forward_proj", "relu")
    if projection not in FEED_FORWARD:
        raise ValueError(f"feed_forward_proj={projection!r} is not supported: jaxlm T5 has 'relu' (v1.0) "
                         "and 'gated-gelu' (v1.1)")
    tied = config.get("scale_decoder_outputs", config.get("tie_word_embeddings", True))
    pad = config.get("pad_token_id")
    pad = 0 if pad is None else pad
    start = config.get("decoder_start_token_id")
    layers = config.get("num_layers", 6)
    dropout = config.get("dropout_rate", 0.1)
    fields = dict(
        family="t5", vocab_size=config.get("vocab_size", 32128), hidden_size=config.get("d_model", 512),
        num_layers=layers, num_decoder_layers=config.get("num_decoder_layers") or layers,
        num_heads=config.get("num_heads", 8), head_size=config.get("d_kv", 64),
        intermediate_size=config.get("d_ff", 2048), max_position_embeddings=config.get("n_positions", 512),
        type_vocab_size=0, hidden_dropout=dropout, attention_dropout=dropout,
        activation_dropout=dropout, initializer_range=config.get("initializer_factor", 1.0), fan_in_init=True,
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-6), position_embedding="relative",
        relative_buckets=config.get("relative_attention_num_buckets", 32),
        relative_max_distance=config.get("relative_attention_max_distance", 128), norm="rmsnorm",
        activation=FEED_FORWARD[projection], use_bias=False, tie_embeddings=bool(tied), pad_token_id=pad,
        eos_token_id=special_id(config, "eos_token_id", 1), decoder_start_token_id=pad if start is None else start)
    return build_config(fields, overrides)


def t5_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face T5 config.json dict (T5Config(**d) and AutoConfig accept it)."""
    check_representable(config, "T5", any_head_size=True, family="t5", position_embedding="relative", norm="rmsnorm",
                        use_bias=False, activation=tuple(FEED_FORWARD.values()))
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "vocab_size": config.vocab_size, "d_model": config.hidden_size, "d_kv": config.head_dim,
        "d_ff": config.intermediate_size, "num_layers": config.num_layers,
        "num_decoder_layers": config.decoder_layers, "num_heads": config.num_heads,
        "relative_attention_num_buckets": config.relative_buckets,
        "relative_attention_max_distance": config.relative_max_distance,
        "dropout_rate": config.hidden_dropout, "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_factor": config.initializer_range,
        "feed_forward_proj": next(k for k, v in FEED_FORWARD.items() if v == config.activation),
        "is_encoder_decoder": True, "use_cache": True, "pad_token_id": config.pad_token_id,
        "eos_token_id": hf_id(config.eos_token_id),
        "decoder_start_token_id": config.decoder_start_token_id,
        "tie_word_embeddings": config.tie_embeddings,
    }


# ---------------------------------------------------------------- name map

def _attention(ours: str, theirs: str) -> list[Entry]:
    return attention(ours, [f"{theirs}.{n}" for n in ("q", "k", "v", "o")], bias=False)


def _mlp(ours: str, theirs: str, config: TransformerConfig) -> list[Entry]:
    names = (("wi_0", "gate"), ("wi_1", "up"), ("wo", "down")) if config.gated_mlp else (
        ("wi", "intermediate"), ("wo", "output"))
    return [e for t, o in names for e in dense(f"{ours}/mlp/{o}", f"{theirs}.DenseReluDense.{t}", bias=False)] + [
        Entry(f"{ours}/mlp_norm/scale", f"{theirs}.layer_norm.weight")]


def t5_name_map(config: TransformerConfig) -> list[Entry]:
    """Every tensor of HF T5ForConditionalGeneration but the tied copies of `shared.weight`."""
    entries = [Entry("shared/embedding", SHARED)]
    for stack, count in (("encoder", config.num_layers), ("decoder", config.decoder_layers)):
        entries.append(Entry(f"{stack}/relative_bias/embedding",
                             f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
        for i in range(count):
            ours, theirs = f"{stack}/layer_{i}", f"{stack}.block.{i}.layer"
            entries += _attention(f"{ours}/self_attention", f"{theirs}.0.SelfAttention")
            entries.append(Entry(f"{ours}/self_attention_norm/scale", f"{theirs}.0.layer_norm.weight"))
            if stack == "decoder":
                entries += _attention(f"{ours}/cross_attention", f"{theirs}.1.EncDecAttention")
                entries.append(Entry(f"{ours}/cross_attention_norm/scale", f"{theirs}.1.layer_norm.weight"))
            entries += _mlp(ours, f"{theirs}.{2 if stack == 'decoder' else 1}", config)
        entries.append(Entry(f"{stack}/final_norm/scale", f"{stack}.final_layer_norm.weight"))
    if not config.tie_embeddings:
        entries.append(Entry("lm_head", LM_HEAD, "linear"))
    return entries


def _tied(config: TransformerConfig) -> dict[str, str]:
    """The copies of `shared.weight`: the embedding tables, and the LM head of a v1.0 (tied) config."""
    return {copy: SHARED for copy in EMBED_COPIES + ((LM_HEAD,) if config.tie_embeddings else ())}


def _model(config: TransformerConfig) -> str:
    return "T5 v1.0" if config.tie_embeddings else "T5 v1.1"


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our T5 (no allocation)."""
    return param_shapes(T5ForConditionalGeneration, config, 2)


# ---------------------------------------------------------------- both ways

def t5_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> dict:
    """Our T5 parameter tree (plain float32 numpy; scan layout when `config.scan_layers`) from HF
    T5ForConditionalGeneration tensors; raises ValueError listing unknown, missing and wrongly shaped
    tensors. The repeated embedding tables must equal `shared.weight`; an untied config without
    `lm_head.weight` takes `shared.weight` as its head, as transformers does."""
    tensors = fold_copies(tensors, _tied(config), _model(config))
    if not config.tie_embeddings and LM_HEAD not in tensors and SHARED in tensors:
        tensors[LM_HEAD] = tensors[SHARED]  # Hugging Face ties a head the checkpoint lacks to the embeddings
    return params_from_hf(tensors, config, {"model": t5_name_map(config)}, expected_shapes(config), _model(config),
                          ignored=IGNORED)


def t5_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """The full HF T5ForConditionalGeneration state dict (embedding copies and `lm_head.weight`
    included) from our tree: boxed or plain, with or without `params`, loop or scan layout per config."""
    return params_to_hf(params, config, {"model": t5_name_map(config)}, expected_shapes(config), _model(config),
                        tied=_tied(config))
