"""Hugging Face T5 checkpoints <-> jaxlm T5: config, tensor names, layouts and shape checks."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlm.convert.hf import _listed, _plain, build_config, check_family, flatten, param_shapes
from jaxlm.convert.hf_decoder import LAYOUTS, entries_to_params
from jaxlm.convert.layout import stack_layers, unstack_layers
from jaxlm.models.config import TransformerConfig

Entry = tuple[str, str, str]
SHARED, LM_HEAD = "shared.weight", "lm_head.weight"
EMBED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
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
    eos = config.get("eos_token_id", 1)
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
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
        eos_token_id=-1 if eos is None else eos, decoder_start_token_id=pad if start is None else start)
    return build_config(fields, overrides)


def t5_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face T5 config.json dict (T5Config(**d) and AutoConfig accept it)."""
    _check_representable(config)
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
        "eos_token_id": None if config.eos_token_id < 0 else config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        "tie_word_embeddings": config.tie_embeddings,
    }


def _check_representable(config: TransformerConfig) -> None:
    wanted = dict(family="t5", position_embedding="relative", norm="rmsnorm", use_bias=False)
    wrong = [f"{k}={getattr(config, k)!r} (T5 needs {v!r})" for k, v in wanted.items() if getattr(config, k) != v]
    if config.activation not in FEED_FORWARD.values():
        wrong.append(f"activation={config.activation!r} (T5 has 'relu' or 'geglu')")
    if config.kv_heads != config.num_heads:
        wrong.append(f"num_kv_heads={config.num_kv_heads} (T5 has plain multi-head attention)")
    if wrong:
        raise ValueError(f"this config has no Hugging Face T5 equivalent: {'; '.join(wrong)}")


# ---------------------------------------------------------------- name map

def _attention(ours: str, theirs: str) -> list[Entry]:
    return [(f"{theirs}.{t}.weight", f"{ours}/{o}/kernel", "linear_heads_in")
            for t, o in (("q", "query"), ("k", "key"), ("v", "value"))] + [
        (f"{theirs}.o.weight", f"{ours}/output/kernel", "linear_heads_out")]


def _mlp(ours: str, theirs: str, config: TransformerConfig) -> list[Entry]:
    names = (("wi_0", "gate"), ("wi_1", "up"), ("wo", "down")) if config.gated_mlp else (
        ("wi", "intermediate"), ("wo", "output"))
    return [(f"{theirs}.DenseReluDense.{t}.weight", f"{ours}/mlp/{o}/kernel", "linear") for t, o in names] + [
        (f"{theirs}.layer_norm.weight", f"{ours}/mlp_norm/scale", "copy")]


def t5_name_map(config: TransformerConfig) -> list[Entry]:
    """[(HF T5ForConditionalGeneration name, our '/'-joined loop-layout path, layout kind)]."""
    entries = [(SHARED, "shared/embedding", "copy")]
    for stack, count in (("encoder", config.num_layers), ("decoder", config.decoder_layers)):
        entries.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        f"{stack}/relative_bias/embedding", "copy"))
        for i in range(count):
            ours, theirs = f"{stack}/layer_{i}", f"{stack}.block.{i}.layer"
            entries += _attention(f"{ours}/self_attention", f"{theirs}.0.SelfAttention")
            entries.append((f"{theirs}.0.layer_norm.weight", f"{ours}/self_attention_norm/scale", "copy"))
            if stack == "decoder":
                entries += _attention(f"{ours}/cross_attention", f"{theirs}.1.EncDecAttention")
                entries.append((f"{theirs}.1.layer_norm.weight", f"{ours}/cross_attention_norm/scale", "copy"))
            entries += _mlp(ours, f"{theirs}.{2 if stack == 'decoder' else 1}", config)
        entries.append((f"{stack}.final_layer_norm.weight", f"{stack}/final_norm/scale", "copy"))
    if not config.tie_embeddings:
        entries.append((LM_HEAD, "lm_head", "linear"))
    return entries


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our T5 (no allocation)."""
    from jaxlm.models.t5 import T5ForConditionalGeneration

    return param_shapes(T5ForConditionalGeneration, config, 2)


# ---------------------------------------------------------------- HF -> ours

def _fold_copies(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> dict[str, np.ndarray]:
    """`tensors` with the repeated embedding tables checked against `shared.weight` and dropped."""
    tensors = dict(tensors)
    copies = EMBED_COPIES + ((LM_HEAD,) if config.tie_embeddings else ())
    if SHARED not in tensors:
        found = [name for name in copies if name in tensors]
        if found:
            tensors[SHARED] = tensors[found[0]]
    for name in copies:
        copy = tensors.pop(name, None)
        if copy is not None and not np.array_equal(copy, tensors[SHARED]):
            raise ValueError(f"{name} differs from {SHARED}, but jaxlm T5 shares one embedding table"
                             + (" with a tied LM head (the config says v1.0: tie_word_embeddings / "
                                "scale_decoder_outputs)" if name == LM_HEAD else ""))
    if not config.tie_embeddings and LM_HEAD not in tensors and SHARED in tensors:
        tensors[LM_HEAD] = tensors[SHARED]  # Hugging Face ties a head the checkpoint lacks to the embeddings
    for name in IGNORED:
        tensors.pop(name, None)
    return tensors


def t5_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> dict:
    """Our T5 parameter tree (plain float32 numpy; scan layout when `config.scan_layers`) from HF
    T5ForConditionalGeneration tensors; raises ValueError listing unknown, missing and wrongly shaped
    tensors. The repeated embedding tables must equal `shared.weight`; an untied config without
    `lm_head.weight` takes `shared.weight` as its head, as transformers does."""
    entries = [(theirs, (ours,), kind) for theirs, ours, kind in t5_name_map(config)]
    params = entries_to_params(_fold_copies(tensors, config), config, entries, expected_shapes(config), "T5")
    return stack_layers(params) if config.scan_layers else params


# ---------------------------------------------------------------- ours -> HF

def t5_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """The full HF T5ForConditionalGeneration state dict (embedding copies and `lm_head.weight`
    included) from our tree: boxed or plain, with or without `params`, loop or scan layout per config."""
    plain = _plain(params)
    if config.scan_layers:
        plain = unstack_layers(plain)
    flat = {path: np.asarray(value, np.float32) for path, value in flatten(plain)}
    entries = t5_name_map(config)
    unknown = sorted(set(flat) - {ours for _, ours, _ in entries})
    if unknown:
        raise ValueError(f"parameters with no Hugging Face T5 name: {_listed(unknown)}")
    missing = [ours for _, ours, _ in entries if ours not in flat]
    if missing:
        raise ValueError(f"parameter tree lacks {len(missing)} parameters the config needs: {_listed(missing)}")
    tensors = {theirs: np.ascontiguousarray(LAYOUTS[kind][1]([flat[ours]], config)) for theirs, ours, kind in entries}
    for name in EMBED_COPIES + ((LM_HEAD,) if config.tie_embeddings else ()):
        tensors[name] = tensors[SHARED].copy()
    return tensors
