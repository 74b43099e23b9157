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

from jaxlm.convert.hf import (CONFIG_FIELDS, _check_shapes, _dense, _listed, _norm, _plain, _present_groups,
                              build_config, check_family, check_representable, encoder_layer, flatten, param_shapes,
                              to_hf, to_ours, unflatten)
from jaxlm.models.config import TransformerConfig

Entry = tuple[str, str, str]
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
ROBERTA_TIED = {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
                "lm_head.decoder.bias": "lm_head.bias"}
DISTILBERT_TIED = {"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"}


# ---------------------------------------------------------------- config

def roberta_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face RoBERTa config.json dict; `overrides` win (e.g. dtype)."""
    check_family(config, "roberta", "Roberta")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(
            f"hidden_act={config['hidden_act']!r} is not supported: jaxlm RoBERTa uses exact (erf) 'gelu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type={config['position_embedding_type']!r} is not supported: "
                         "jaxlm RoBERTa uses 'absolute' learned positions")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ValueError("decoder/cross-attention RoBERTa configs are not supported")
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
    names = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_heads",
             "hidden_dim": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
             "dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
             "initializer_range": "initializer_range", "pad_token_id": "pad_token_id"}
    fields = {"family": "distilbert", "num_layers": 6, **{ours: config[theirs] for theirs, ours in names.items() if theirs in config},
              "type_vocab_size": 0, "layer_norm_eps": 1e-12, "position_offset": 0}
    return build_config(fields, overrides)


def roberta_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face RoBERTa config.json dict (RobertaForMaskedLM) describing `config`."""
    check_representable(config, "RoBERTa", norm="layernorm", activation="gelu", position_embedding="learned",
                        position_offset=config.pad_token_id + 1, use_bias=True, tie_embeddings=True, embedding_size=0)
    fields = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    return {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], **fields, "hidden_act": "gelu",
            "position_embedding_type": "absolute", "pad_token_id": config.pad_token_id, "tie_word_embeddings": True}


def distilbert_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face DistilBERT config.json dict (DistilBertForMaskedLM) describing `config`."""
    check_representable(config, "DistilBERT", norm="layernorm", activation="gelu", position_embedding="learned",
                        position_offset=0, type_vocab_size=0, layer_norm_eps=1e-12, use_bias=True,
                        tie_embeddings=True, embedding_size=0)
    return {"model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"], "vocab_size": config.vocab_size,
            "dim": config.hidden_size, "n_layers": config.num_layers, "n_heads": config.num_heads,
            "hidden_dim": config.intermediate_size, "max_position_embeddings": config.max_position_embeddings,
            "dropout": config.hidden_dropout, "attention_dropout": config.attention_dropout,
            "initializer_range": config.initializer_range, "pad_token_id": config.pad_token_id,
            "activation": "gelu", "sinusoidal_pos_embds": False, "tie_word_embeddings": True}


# ---------------------------------------------------------------- name maps

def roberta_name_map(config: TransformerConfig) -> dict[str, list[Entry]]:
    """Group -> [(our '/'-joined path, HF RobertaForMaskedLM name, layout kind)]."""
    embeddings = [
        ("encoder/embeddings/word/embedding", "roberta.embeddings.word_embeddings.weight", "copy"),
        ("encoder/embeddings/position/embedding", "roberta.embeddings.position_embeddings.weight", "copy"),
        ("encoder/embeddings/token_type/embedding", "roberta.embeddings.token_type_embeddings.weight", "copy"),
        *_norm("encoder/embeddings/norm", "roberta.embeddings.LayerNorm"),
    ]
    return {
        "encoder": embeddings + [e for i in range(config.num_layers) for e in encoder_layer(i, "roberta.encoder.layer")],
        "pooler": _dense("encoder/pooler", "roberta.pooler.dense"),
        "mlm": [("mlm/bias", "lm_head.bias", "copy"), *_dense("mlm/transform", "lm_head.dense"),
                *_norm("mlm/norm", "lm_head.layer_norm")],
    }


DISTILBERT_LAYER_NAMES = ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
                          "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm")


def distilbert_name_map(config: TransformerConfig) -> dict[str, list[Entry]]:
    """Group -> [(our '/'-joined path, HF DistilBertForMaskedLM name, layout kind)]."""
    embeddings = [
        ("encoder/embeddings/word/embedding", "distilbert.embeddings.word_embeddings.weight", "copy"),
        ("encoder/embeddings/position/embedding", "distilbert.embeddings.position_embeddings.weight", "copy"),
        *_norm("encoder/embeddings/norm", "distilbert.embeddings.LayerNorm"),
    ]
    return {
        "encoder": embeddings + [e for i in range(config.num_layers) for e in encoder_layer(i, "distilbert.transformer.layer", DISTILBERT_LAYER_NAMES)],
        "mlm": [("mlm/bias", "vocab_projector.bias", "copy"), *_dense("mlm/transform", "vocab_transform"),
                *_norm("mlm/norm", "vocab_layer_norm")],
    }


# ---------------------------------------------------------------- shapes

def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our MaskedLM, plus the encoder's optional pooler."""
    from jaxlm.models.heads import MaskedLM

    e = config.hidden_size
    return param_shapes(MaskedLM, config, 4) | {"encoder/pooler/kernel": (e, e), "encoder/pooler/bias": (e,)}


# ---------------------------------------------------------------- HF -> ours

def _normalize(tensors: Mapping[str, np.ndarray], prefix: str, head_prefixes: tuple[str, ...]) -> dict:
    out = {}
    for name, value in tensors.items():
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if not name.startswith((f"{prefix}.", *head_prefixes)):
            name = f"{prefix}.{name}"
        out[name] = value
    return out


def encoder_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig,
                           groups: dict[str, list[Entry]], tied: Mapping[str, str], prefix: str, family: str,
                           require_heads: bool, heads: tuple[str, ...] = ("mlm",),
                           shapes: Mapping | None = None) -> dict:
    """Our tree from an encoder family's HF tensors through its name-map `groups`; optional groups the
    checkpoint lacks are left out, unless they are among `heads` and `require_heads`. `shapes`
    defaults to MaskedLM's."""
    for copy, source in tied.items():
        if copy in tensors and source in tensors and not np.array_equal(tensors[copy], tensors[source]):
            raise ValueError(f"{copy} differs from {source}: jaxlm {family} ties them, so this checkpoint "
                             "cannot be represented")
    known = {theirs for entries in groups.values() for _, theirs, _ in entries}
    unknown = sorted(n for n in tensors if n not in known and n not in tied
                     and not n.removeprefix(f"{prefix}.").startswith(BUFFERS))
    if unknown:
        raise ValueError(f"checkpoint tensors jaxlm {family} has no place for: {_listed(unknown)}")
    present = _present_groups(tensors, groups)
    absent_heads = [g for g in heads if g not in present]
    if require_heads and absent_heads:
        raise ValueError(f"checkpoint has no {' or '.join(absent_heads)} head (require_heads=True)")
    entries = [entry for group in present for entry in groups[group]]
    _check_shapes(tensors, entries, expected_shapes(config) if shapes is None else shapes, config)
    return unflatten({ours: np.asarray(to_ours(kind, np.asarray(tensors[theirs], np.float32), config))
                      for ours, theirs, kind in entries})


def roberta_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                           require_head: bool = False) -> dict:
    """Our MaskedLM tree from HF RoBERTa tensors (names with or without `roberta.`); a missing LM head
    is left out of the tree unless `require_head`."""
    tensors = _normalize(tensors, "roberta", ("lm_head.",))
    return encoder_params_from_hf(tensors, config, roberta_name_map(config), ROBERTA_TIED, "roberta", "RoBERTa",
                                  require_head)


def distilbert_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                              require_head: bool = False) -> dict:
    """Our MaskedLM tree from HF DistilBERT tensors (names with or without `distilbert.`); a missing
    LM head is left out of the tree unless `require_head`."""
    tensors = _normalize(tensors, "distilbert", ("vocab_",))
    return encoder_params_from_hf(tensors, config, distilbert_name_map(config), DISTILBERT_TIED, "distilbert",
                                  "DistilBERT", require_head)


# ---------------------------------------------------------------- ours -> HF

def encoder_params_to_hf(params: Mapping, config: TransformerConfig, groups: dict[str, list[Entry]],
                         tied: Mapping[str, str], family: str, shapes: Mapping | None = None) -> dict[str, np.ndarray]:
    """HF tensors of an encoder family from our tree, checked against `shapes` (default: MaskedLM's),
    with the `tied` copies of the word table written when the MLM head is present."""
    flat = {path: np.asarray(value, np.float32) for path, value in flatten(_plain(params))}
    known = {ours for entries in groups.values() for ours, _, _ in entries}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ValueError(f"parameters with no Hugging Face {family} name: {_listed(unknown)}")
    shapes = expected_shapes(config) if shapes is None else shapes
    wrong = [f"{ours}: want {shapes[ours]}, got {flat[ours].shape}"
             for ours in flat if flat[ours].shape != shapes[ours]]
    if wrong:
        raise ValueError(f"parameters do not fit the config ({len(wrong)} shape mismatches): {_listed(wrong)}")
    tensors = {theirs: np.ascontiguousarray(to_hf(kind, flat[ours], config))
               for entries in groups.values() for ours, theirs, kind in entries if ours in flat}
    if "mlm/bias" in flat:
        tensors.update({copy: tensors[source].copy() for copy, source in tied.items()})
    return tensors


def roberta_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF RobertaForMaskedLM tensors from our tree (boxed or plain, with or without `params`),
    including the tied `lm_head.decoder.*` copies when the MLM head is present."""
    return encoder_params_to_hf(params, config, roberta_name_map(config), ROBERTA_TIED, "RoBERTa")


def distilbert_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF DistilBertForMaskedLM tensors from our tree (boxed or plain, with or without `params`),
    including the tied `vocab_projector.weight` copy when the MLM head is present."""
    return encoder_params_to_hf(params, config, distilbert_name_map(config), DISTILBERT_TIED, "DistilBERT")
