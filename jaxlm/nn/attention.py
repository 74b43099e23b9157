"""Scaled dot-product attention behind one function, with the kernel chosen by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def padding_mask_lengths(padding_mask: jax.Array) -> jax.Array:
    """Per-row count of real tokens in a right-padded [batch, length] mask."""
    return jnp.sum(padding_mask.astype(jnp.int32), axis=-1)


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    padding_mask: jax.Array | None = None,
    kernel: str = "xla",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
    """Attention over [batch, length, heads, head_dim] inputs.

    `padding_mask` is [batch, length], true at real (right-padded) tokens. `xla` is portable and
    supports attention dropout; `cudnn` is the fused GPU kernel (no dropout).
    """
    if kernel == "cudnn":
        lengths = None if padding_mask is None else padding_mask_lengths(padding_mask)
        return jax.nn.dot_product_attention(
            query, key, value, key_value_seq_lengths=lengths, implementation="cudnn")
    if kernel != "xla":
        raise ValueError(f"unknown attention kernel {kernel!r}; choose xla or cudnn")
    scale = query.shape[-1] ** -0.5
    logits = jnp.einsum("bqhd,bkhd->bhqk", query * jnp.asarray(scale, query.dtype), key)
    logits = logits.astype(jnp.float32)
    if padding_mask is not None:
        logits = jnp.where(padding_mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1)
    if dropout_rate > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)
