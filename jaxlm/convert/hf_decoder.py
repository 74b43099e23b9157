"""Hugging Face GPT-2 and Llama checkpoints <-> jaxlm decoders: config, tensor names, layouts, shapes.

Parameter trees are plain nested dicts of float32 numpy arrays laid out like the ``params``
collection of :class:`jaxlm.models.decoder.CausalLM`. A Hugging Face tensor may hold several of
our parameters (GPT-2 fuses query, key and value into one ``c_attn``). GPT-2 stores ``Conv1D`` weights
as [in, out] (our layout, no transpose); Llama stores ``nn.Linear`` weights as [out, in].
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlm.convert.hf import (build_config, check_family, check_representable, hf_id, param_shapes,
                              read_config, read_tensors, special_id)
from jaxlm.convert.names import Entry, attention, dense, norm, params_from_hf, params_to_hf, prefixed
from jaxlm.models.config import TransformerConfig
from jaxlm.models.decoder import CausalLM

GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")
LLAMA_BUFFERS = (".rotary_emb.inv_freq",)
LM_HEAD = "lm_head.weight"
GPT2_TOKENS, LLAMA_TOKENS = "transformer.wte.weight", "model.embed_tokens.weight"


# ---------------------------------------------------------------- config

def gpt2_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face GPT-2 config.json dict; `overrides` win (e.g. dtype)."""
    check_family(config, "gpt2", "GPT2")
    activation = config.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"activation_function={activation!r} is not supported: jaxlm GPT-2 uses 'gelu_new'")
    if not config.get("scale_attn_weights", True) or config.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError("GPT-2 attention scaling other than 1/sqrt(head_dim) is not supported")
    if config.get("add_cross_attention"):
        raise ValueError("GPT-2 cross-attention is not supported")
    hidden = config.get("n_embd", 768)
    fields = dict(
        family="gpt2", vocab_size=config.get("vocab_size", 50257), hidden_size=hidden,
        num_layers=config.get("n_layer", 12), num_heads=config.get("n_head", 12), intermediate_size=config.get("n_inner") or 4 * hidden,
        max_position_embeddings=config.get("n_positions", 1024), type_vocab_size=0,
        hidden_dropout=config.get("resid_pdrop", 0.1), attention_dropout=config.get("attn_pdrop", 0.1),
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
        initializer_range=config.get("initializer_range", 0.02), activation="gelu_tanh",
        tie_embeddings=config.get("tie_word_embeddings", True), eos_token_id=special_id(config, "eos_token_id"))
    return build_config(fields, overrides)


def _rope_theta(config: Mapping) -> float:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"rope_type={kind!r} is not supported: jaxlm Llama uses plain ('default') RoPE")
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def llama_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face Llama config.json dict; `overrides` win (e.g. dtype)."""
    check_family(config, "llama", "Llama")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={config['hidden_act']!r} is not supported: jaxlm Llama uses 'silu'")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ValueError("Llama attention_bias/mlp_bias are not supported: jaxlm Llama has no biases")
    heads = config.get("num_attention_heads", 32)
    hidden = config.get("hidden_size", 4096)
    head_dim = config.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        raise ValueError(f"head_dim={head_dim} * num_attention_heads={heads} != hidden_size={hidden}: "
                         "jaxlm needs head_dim = hidden_size / num_attention_heads")
    fields = dict(
        family="llama", vocab_size=config.get("vocab_size", 32000), hidden_size=hidden,
        num_layers=config.get("num_hidden_layers", 32), num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        intermediate_size=config.get("intermediate_size", 11008),
        max_position_embeddings=config.get("max_position_embeddings", 2048), type_vocab_size=0,
        hidden_dropout=0.0, attention_dropout=config.get("attention_dropout", 0.0),
        layer_norm_eps=config.get("rms_norm_eps", 1e-6), initializer_range=config.get("initializer_range", 0.02),
        position_embedding="rope", rope_theta=_rope_theta(config), norm="rmsnorm", activation="swiglu",
        use_bias=False, tie_embeddings=config.get("tie_word_embeddings", False),
        eos_token_id=special_id(config, "eos_token_id"), bos_token_id=special_id(config, "bos_token_id"))
    return build_config(fields, overrides)


def _token_ids(config: TransformerConfig, bos_is_eos: bool = False) -> dict:
    """The ids of end and beginning of text, None where the model has none: left out, transformers fills in its own
    defaults (GPT-2's 50256, Llama's 2 and 1), which a smaller vocabulary lacks or holds as other tokens. GPT-2
    begins text with its end-of-text token."""
    eos = hf_id(config.eos_token_id)
    return {"eos_token_id": eos, "bos_token_id": eos if bos_is_eos else hf_id(config.bos_token_id)}


def gpt2_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face GPT-2 config.json dict (GPT2LMHeadModel) describing `config`."""
    check_representable(config, "GPT-2", norm="layernorm", activation="gelu_tanh", position_embedding="learned",
                        position_offset=0, type_vocab_size=0, use_bias=True, embedding_size=0)
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
            "n_embd": config.hidden_size, "n_layer": config.num_layers, "n_head": config.num_heads,
            "n_inner": config.intermediate_size, "n_positions": config.max_position_embeddings,
            "resid_pdrop": config.hidden_dropout, "embd_pdrop": config.hidden_dropout,
            "attn_pdrop": config.attention_dropout, "layer_norm_epsilon": config.layer_norm_eps,
            "initializer_range": config.initializer_range, "activation_function": "gelu_new",
            "scale_attn_weights": True, "tie_word_embeddings": config.tie_embeddings,
            **_token_ids(config, bos_is_eos=True)}


def llama_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face Llama config.json dict (LlamaForCausalLM) describing `config`."""
    check_representable(config, "Llama", grouped_kv=True, norm="rmsnorm", activation="swiglu",
                        position_embedding="rope", type_vocab_size=0, use_bias=False, embedding_size=0)
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "num_key_value_heads": config.kv_heads,
            "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.layer_norm_eps,
            "initializer_range": config.initializer_range, "attention_dropout": config.attention_dropout,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "tie_word_embeddings": config.tie_embeddings, **_token_ids(config)}


# ---------------------------------------------------------------- name maps

def gpt2_name_map(config: TransformerConfig) -> list[Entry]:
    """Every tensor of HF GPT2LMHeadModel but a tied `lm_head.weight`."""
    entries = [Entry("decoder/token/embedding", "transformer.wte.weight"),
               Entry("decoder/position/embedding", "transformer.wpe.weight")]
    for i in range(config.num_layers):
        ours, theirs = f"decoder/layer_{i}", f"transformer.h.{i}"
        qkv = tuple(f"{ours}/attention/{n}" for n in ("query", "key", "value"))
        entries += [
            *norm(f"{ours}/attention_norm", f"{theirs}.ln_1"),
            Entry(tuple(f"{p}/kernel" for p in qkv), f"{theirs}.attn.c_attn.weight", "qkv"),
            Entry(tuple(f"{p}/bias" for p in qkv), f"{theirs}.attn.c_attn.bias", "qkv"),
            *dense(f"{ours}/attention/output", f"{theirs}.attn.c_proj", "conv_heads_out"),
            *norm(f"{ours}/mlp_norm", f"{theirs}.ln_2"),
            *dense(f"{ours}/mlp/intermediate", f"{theirs}.mlp.c_fc", "copy"),
            *dense(f"{ours}/mlp/output", f"{theirs}.mlp.c_proj", "copy"),
        ]
    return entries + norm("decoder/final_norm", "transformer.ln_f") + _head(config)


def llama_name_map(config: TransformerConfig) -> list[Entry]:
    """Every tensor of HF LlamaForCausalLM but a tied `lm_head.weight`."""
    entries = [Entry("decoder/token/embedding", "model.embed_tokens.weight")]
    for i in range(config.num_layers):
        ours, theirs = f"decoder/layer_{i}", f"model.layers.{i}"
        projections = [f"{theirs}.self_attn.{n}_proj" for n in ("q", "k", "v", "o")]
        entries += [
            Entry(f"{ours}/attention_norm/scale", f"{theirs}.input_layernorm.weight"),
            *attention(f"{ours}/attention", projections, bias=False),
            Entry(f"{ours}/mlp_norm/scale", f"{theirs}.post_attention_layernorm.weight"),
            *(entry for n in ("gate", "up", "down")
              for entry in dense(f"{ours}/mlp/{n}", f"{theirs}.mlp.{n}_proj", bias=False)),
        ]
    return entries + [Entry("decoder/final_norm/scale", "model.norm.weight")] + _head(config)


def _head(config: TransformerConfig) -> list[Entry]:
    return [] if config.tie_embeddings else [Entry("lm_head", LM_HEAD, "linear")]


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our CausalLM (no allocation)."""
    return param_shapes(CausalLM, config, 1)


# ---------------------------------------------------------------- both ways

def _tied(config: TransformerConfig, source: str) -> dict[str, str]:
    return {LM_HEAD: source} if config.tie_embeddings else {}


def gpt2_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> dict:
    """Our CausalLM parameter tree from HF GPT-2 tensors (names with or without `transformer.`)."""
    return params_from_hf(prefixed(tensors, "transformer.", (LM_HEAD,)), config, {"model": gpt2_name_map(config)},
                          expected_shapes(config), "GPT-2", tied=_tied(config, GPT2_TOKENS), ignored=GPT2_BUFFERS)


def llama_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> dict:
    """Our CausalLM parameter tree from HF Llama tensors (names with or without `model.`)."""
    return params_from_hf(prefixed(tensors, "model.", (LM_HEAD,)), config, {"model": llama_name_map(config)},
                          expected_shapes(config), "Llama", tied=_tied(config, LLAMA_TOKENS), ignored=LLAMA_BUFFERS)


def gpt2_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF GPT2LMHeadModel tensors (with the tied `lm_head.weight`) from our tree, boxed or plain."""
    return params_to_hf(params, config, {"model": gpt2_name_map(config)}, expected_shapes(config), "GPT-2",
                        tied=_tied(config, GPT2_TOKENS))


def llama_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF LlamaForCausalLM tensors from our tree, boxed or plain."""
    return params_to_hf(params, config, {"model": llama_name_map(config)}, expected_shapes(config), "Llama",
                        tied=_tied(config, LLAMA_TOKENS))


# ---------------------------------------------------------------- loading a directory

FAMILIES = {"gpt2": (gpt2_config_from_hf, gpt2_params_from_hf),
            "llama": (llama_config_from_hf, llama_params_from_hf)}


def load_hf_decoder(model_dir, **config_overrides) -> tuple[TransformerConfig, dict]:
    """(config, parameter tree) of a Hugging Face GPT-2 or Llama checkpoint directory."""
    hf_config = read_config(model_dir)
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type={model_type!r} is not a supported decoder; choose one of {sorted(FAMILIES)}")
    config_from_hf, params_from_hf = FAMILIES[model_type]
    config = config_from_hf(hf_config, **config_overrides)
    return config, params_from_hf(read_tensors(model_dir), config)
