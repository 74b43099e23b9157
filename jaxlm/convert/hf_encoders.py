"""Hugging Face RoBERTa and DistilBERT checkpoints <-> jaxlm encoders: config, tensor names, shapes.

Both run on the BERT encoder (post-LN layers, exact GELU) under :class:`jaxlm.models.heads.MaskedLM`,
so parameter trees are plain nested dicts of float32 numpy arrays laid out like its ``params``
collection (``encoder``, ``mlm``). RoBERTa differs from BERT in its positions (numbered from
``pad_token_id + 1`` over non-pad tokens: ``position_offset``) and a one-row token-type table;
DistilBERT has no token-type table (``type_vocab_size=0``) and no pooler. The masked-LM head is
optional (a bare ``RobertaModel``/``DistilBertModel`` has none); RoBERTa's pooler, when a checkpoint
has one, goes to ``encoder/pooler`` as in :class:`jaxlm.models.encoder.BertEncoder`. The decoder
weights (and RoBERTa's decoder bias) are tied copies: they must equal their sources on the way in
and are written back as copies on the way out.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlm.convert.hf import (CONFIG_FIELDS, EncoderNames, bert_like_config_to_hf, build_config, check_bert_layers,
                              check_family, check_representable, mlm_head, param_shapes)
from jaxlm.models.config import TransformerConfig
from jaxlm.models.heads import MaskedLM

DISTILBERT_FIELDS = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_heads",
                     "hidden_dim": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
                     "dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
                     "initializer_range": "initializer_range", "pad_token_id": "pad_token_id"}
ROBERTA_TIED = {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
                "lm_head.decoder.bias": "lm_head.bias"}
DISTILBERT_TIED = {"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"}
ROBERTA = EncoderNames(
    "RoBERTa", "roberta", heads={"mlm": mlm_head("lm_head.bias", "lm_head.dense", "lm_head.layer_norm")},
    head_prefixes=("lm_head.",), tied=ROBERTA_TIED)
DISTILBERT = EncoderNames(
    "DistilBERT", "distilbert", heads={"mlm": mlm_head("vocab_projector.bias", "vocab_transform", "vocab_layer_norm")},
    head_prefixes=("vocab_",), tied=DISTILBERT_TIED, layers="transformer.layer",
    layer_names=("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "sa_layer_norm",
                 "ffn.lin1", "ffn.lin2", "output_layer_norm"),
    token_types=False, pooler="")


# ---------------------------------------------------------------- config

def roberta_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face RoBERTa config.json dict; `overrides` win (e.g. dtype)."""
    check_family(config, "roberta", "Roberta")
    check_bert_layers(config, "RoBERTa")
    fields = {ours: config[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in config}
    pad = config.get("pad_token_id", 1)
    fields = {"family": "roberta", "vocab_size": 50265, **fields, "pad_token_id": pad, "position_offset": pad + 1}
    return build_config(fields, overrides)


def distilbert_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face DistilBERT config.json dict; `overrides` win (e.g. dtype).

    A checkpoint with ``sinusoidal_pos_embds`` stores its (fixed) table like a learned one; it loads
    exactly, but jaxlm treats it as learned from then on.
    """
    check_family(config, "distilbert", "DistilBert")
    if config.get("activation", "gelu") != "gelu":
        raise ValueError(
            f"activation={config['activation']!r} is not supported: jaxlm DistilBERT uses exact (erf) 'gelu'")
    fields = {ours: config[theirs] for theirs, ours in DISTILBERT_FIELDS.items() if theirs in config}
    fields = {"family": "distilbert", "num_layers": 6, **fields, "type_vocab_size": 0, "layer_norm_eps": 1e-12,
              "position_offset": 0}
    return build_config(fields, overrides)


def roberta_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face RoBERTa config.json dict (RobertaForMaskedLM) describing `config`."""
    return bert_like_config_to_hf(config, "RoBERTa", "roberta", "RobertaForMaskedLM",
                                  position_offset=config.pad_token_id + 1)


def distilbert_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face DistilBERT config.json dict (DistilBertForMaskedLM) describing `config`."""
    check_representable(config, "DistilBERT", norm="layernorm", activation="gelu", position_embedding="learned",
                        position_offset=0, type_vocab_size=0, layer_norm_eps=1e-12, use_bias=True,
                        tie_embeddings=True, embedding_size=0)
    fields = {theirs: getattr(config, ours) for theirs, ours in DISTILBERT_FIELDS.items()}
    return {"model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"], **fields, "activation": "gelu",
            "sinusoidal_pos_embds": False, "tie_word_embeddings": True}


# ---------------------------------------------------------------- shapes

def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our MaskedLM, plus the encoder's optional pooler."""
    e = config.hidden_size
    return param_shapes(MaskedLM, config, 4) | {"encoder/pooler/kernel": (e, e), "encoder/pooler/bias": (e,)}


# ---------------------------------------------------------------- both ways

def roberta_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                           require_head: bool = False) -> dict:
    """Our MaskedLM tree from HF RoBERTa tensors (names with or without `roberta.`); a missing LM head
    is left out of the tree unless `require_head`."""
    return ROBERTA.params_from_hf(tensors, config, expected_shapes(config), require_head)


def distilbert_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                              require_head: bool = False) -> dict:
    """Our MaskedLM tree from HF DistilBERT tensors (names with or without `distilbert.`); a missing
    LM head is left out of the tree unless `require_head`."""
    return DISTILBERT.params_from_hf(tensors, config, expected_shapes(config), require_head)


def roberta_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF RobertaForMaskedLM tensors from our tree (boxed or plain, with or without `params`),
    including the tied `lm_head.decoder.*` copies when the MLM head is present."""
    return ROBERTA.params_to_hf(params, config, expected_shapes(config))


def distilbert_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF DistilBertForMaskedLM tensors from our tree (boxed or plain, with or without `params`),
    including the tied `vocab_projector.weight` copy when the MLM head is present."""
    return DISTILBERT.params_to_hf(params, config, expected_shapes(config))
