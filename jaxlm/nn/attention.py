"""Scaled dot-product attention behind one function, with the kernel chosen by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp


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
