"""Scaled dot-product attention behind one function, with the kernel chosen by name."""
from __future__ import annotations

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.nn.embed import rotary_embedding
from jaxlm.nn.layers import Dense

if TYPE_CHECKING:
    from jaxlm.models.config import TransformerConfig


def padding_mask_lengths(padding_mask: jax.Array) -> jax.Array:
    """Per-row count of real tokens in a right-padded [batch, length] mask."""
    return jnp.sum(padding_mask.astype(jnp.int32), axis=-1)


def attention_mask(length: int, padding_mask: jax.Array | None = None, causal: bool = False,
                   segment_ids: jax.Array | None = None) -> jax.Array | None:
    """A boolean mask broadcastable to [batch, heads, query, key], or None when nothing is masked."""
    mask = None
    if padding_mask is not None:
        mask = padding_mask.astype(bool)[:, None, None, :]
    if causal:
        lower = jnp.tril(jnp.ones((length, length), bool))[None, None]
        mask = lower if mask is None else mask & lower
    if segment_ids is not None:
        same = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
        mask = same if mask is None else mask & same
    return mask


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    padding_mask: jax.Array | None = None,
    kernel: str = "xla",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    causal: bool = False,
    segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Attention over [batch, length, heads, head_dim] queries; keys and values may have fewer heads
    (grouped-query attention: query head h reads key/value head h // (heads / kv_heads)).

    `padding_mask` is [batch, length], true at real (right-padded) tokens. `causal` lets each token
    attend only to itself and earlier ones; `segment_ids` [batch, length] keeps packed documents
    apart (tokens attend within their own segment id). `xla` is portable and supports attention
    dropout; `cudnn` is the fused GPU kernel (no dropout).
    """
    if kernel == "cudnn":
        lengths = None if padding_mask is None else padding_mask_lengths(padding_mask)
        mask = None if segment_ids is None else attention_mask(query.shape[1], segment_ids=segment_ids)
        return jax.nn.dot_product_attention(
            query, key, value, mask=mask, key_value_seq_lengths=lengths, is_causal=causal,
            implementation="cudnn")
    if kernel != "xla":
        raise ValueError(f"unknown attention kernel {kernel!r}; choose xla or cudnn")
    groups = query.shape[2] // key.shape[2]
    if groups > 1:
        key, value = jnp.repeat(key, groups, axis=2), jnp.repeat(value, groups, axis=2)
    scale = query.shape[-1] ** -0.5
    logits = jnp.einsum("bqhd,bkhd->bhqk", query * jnp.asarray(scale, query.dtype), key)
    logits = logits.astype(jnp.float32)
    mask = attention_mask(query.shape[1], padding_mask, causal, segment_ids)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1)
    if dropout_rate > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)


class SelfAttention(nn.Module):
    """Multi-head (or grouped-query) self-attention: projections, rotary positions when configured,
    the kernel the config names, the output projection and dropout. Encoders and decoders share it."""

    config: "TransformerConfig"
    causal: bool = False

    @nn.compact
    def __call__(self, x, padding_mask, deterministic: bool, positions=None, segment_ids=None) -> jax.Array:
        cfg = self.config
        kv_axis = "heads" if cfg.kv_heads == cfg.num_heads else "kv_heads"
        q = Dense(cfg, (cfg.num_heads, cfg.head_dim), ("embed",), ("heads", "kv"), name="query")(x)
        k = Dense(cfg, (cfg.kv_heads, cfg.head_dim), ("embed",), (kv_axis, "kv"), name="key")(x)
        v = Dense(cfg, (cfg.kv_heads, cfg.head_dim), ("embed",), (kv_axis, "kv"), name="value")(x)
        if cfg.position_embedding == "rope":
            q, k = rotary_embedding(q, positions, cfg.rope_theta), rotary_embedding(k, positions, cfg.rope_theta)
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        k, v = (nn.with_logical_constraint(t, ("batch", "length", kv_axis, "kv")) for t in (k, v))
        use_dropout = not deterministic and cfg.attention_dropout > 0.0
        out = dot_product_attention(
            q, k, v, padding_mask=padding_mask, causal=self.causal, segment_ids=segment_ids,
            kernel=cfg.attention_kernel, dropout_rate=cfg.attention_dropout if use_dropout else 0.0,
            dropout_rng=self.make_rng("dropout") if use_dropout else None)
        out = Dense(cfg, cfg.hidden_size, ("heads", "kv"), ("embed",), contract=2, name="output")(out)
        return nn.Dropout(cfg.hidden_dropout)(out, deterministic=deterministic)
