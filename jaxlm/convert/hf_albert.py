"""Hugging Face ALBERT checkpoints <-> jaxlm ALBERT (AlbertForPreTraining trees): config, tensor names, shapes."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlm.convert.hf import (CONFIG_FIELDS, EncoderNames, build_config, check_family, check_representable, mlm_head,
                              param_shapes)
from jaxlm.convert.names import Entry, dense, encoder_layer
from jaxlm.models.albert import AlbertForPreTraining
from jaxlm.models.config import TransformerConfig

TIED = {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
        "predictions.decoder.bias": "predictions.bias"}
# HF hidden_act -> ours; gelu_new and gelu_pytorch_tanh are the same tanh approximation.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# transformers.AlbertConfig's defaults (albert-xxlarge), for keys a config.json leaves out.
HF_DEFAULTS = {"vocab_size": 30000, "hidden_size": 4096, "num_layers": 12, "num_heads": 64,
               "intermediate_size": 16384, "hidden_dropout": 0.0, "attention_dropout": 0.0,
               "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
               "layer_norm_eps": 1e-12}


# ---------------------------------------------------------------- config

def albert_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face ALBERT config.json dict; `overrides` win (e.g. dtype)."""
    check_family(config, "albert", "Albert")
    for key in ("num_hidden_groups", "inner_group_num"):
        if config.get(key, 1) != 1:
            raise ValueError(f"{key}={config[key]} is not supported: jaxlm ALBERT shares one layer across "
                             "depth (num_hidden_groups=1, inner_group_num=1)")
    act = config.get("hidden_act", "gelu_new")
    if act not in ACTIVATIONS:
        raise ValueError(f"hidden_act={act!r} is not supported: jaxlm ALBERT takes one of {sorted(ACTIVATIONS)}")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type={config['position_embedding_type']!r} is not supported: "
                         "jaxlm ALBERT uses 'absolute' learned positions")
    fields = {ours: config[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in config}
    fields = {"family": "albert", **HF_DEFAULTS, **fields, "embedding_size": config.get("embedding_size", 128),
              "activation": ACTIVATIONS[act], "pad_token_id": config.get("pad_token_id") or 0, "position_offset": 0}
    return build_config(fields, overrides)


def albert_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face AlbertForPreTraining config.json dict for `config`."""
    check_representable(config, "ALBERT", activation=tuple(HF_ACTIVATIONS), position_embedding="learned",
                        norm="layernorm", position_offset=0, use_bias=True, tie_embeddings=True)
    if config.type_vocab_size < 1:
        raise ValueError("this albert model cannot be written as a Hugging Face ALBERT config: "
                         f"type_vocab_size={config.type_vocab_size} (needs at least 1)")
    return {
        "architectures": ["AlbertForPreTraining"], "model_type": "albert",
        **{theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()},
        "embedding_size": config.embedding_size or config.hidden_size, "num_hidden_groups": 1, "inner_group_num": 1,
        "hidden_act": HF_ACTIVATIONS[config.activation], "classifier_dropout_prob": config.hidden_dropout,
        "pad_token_id": config.pad_token_id, "bos_token_id": 2, "eos_token_id": 3, "tie_word_embeddings": True,
    }


# ---------------------------------------------------------------- names and shapes

class AlbertNames(EncoderNames):
    """BERT's naming but for the backbone: the factorised embeddings' projection to the hidden size, and
    one layer shared across depth, our `encoder/layer` (no `_i` suffix, so :mod:`jaxlm.convert.layout`
    leaves it alone) and Hugging Face's first layer of its first group."""

    def backbone(self, config: TransformerConfig) -> list[Entry]:
        return [*self.embeddings(), *dense("encoder/projection", "albert.encoder.embedding_hidden_mapping_in"),
                *encoder_layer("encoder/layer", f"albert.{self.layers}", self.layer_names)]


ALBERT = AlbertNames(
    "ALBERT", "albert", head_prefixes=("predictions.", "sop_classifier."), tied=TIED,
    heads={"mlm": mlm_head("predictions.bias", "predictions.dense", "predictions.LayerNorm"),
           "sop": dense("sop", "sop_classifier.classifier")},
    layers="encoder.albert_layer_groups.0.albert_layers.0", pooler="pooler",
    layer_names=("attention.query", "attention.key", "attention.value", "attention.dense", "attention.LayerNorm",
                 "ffn", "ffn_output", "full_layer_layer_norm"))


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our AlbertForPreTraining (no allocation)."""
    return param_shapes(AlbertForPreTraining, config, 4)


# ---------------------------------------------------------------- both ways

def albert_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                          require_heads: bool = False) -> dict:
    """Our AlbertForPreTraining tree from HF ALBERT tensors (names with or without `albert.`).

    Optional groups (pooler, MLM head, SOP head) absent from the checkpoint are left out of the
    tree (AlbertForMaskedLM has no pooler or SOP head, AlbertModel no heads); with `require_heads`
    a missing MLM or SOP head raises instead.
    """
    return ALBERT.params_from_hf(tensors, config, expected_shapes(config), require_heads)


def albert_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF AlbertForPreTraining tensors from our tree (boxed or plain, with or without `params`),
    including the tied `predictions.decoder.*` copies when the MLM head is present."""
    return ALBERT.params_to_hf(params, config, expected_shapes(config))
