"""Cross-entropy in float32 with weights, returning sums so callers can aggregate exactly."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


LOSS_SCOPE = "cross_entropy"  # the ops under it are what `jaxlm bench --profile` counts as the loss


@jax.named_scope(LOSS_SCOPE)
def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None):
    """(loss sum, correct-prediction sum, weight sum) of softmax cross-entropy over the last axis."""
    logits = logits.astype(jnp.float32)
    weights = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    # The label's logit picked by comparison, not take_along_axis: its gradient is then an elementwise select
    # that fuses into the softmax's, where a gather's is a scatter into a zeroed array the size of the logits.
    vocabulary = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    is_label = vocabulary == labels[..., None].astype(jnp.int32)
    label_logit = jnp.sum(jnp.where(is_label, logits, 0.0), axis=-1)
    loss = (log_z - label_logit) * weights
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32) * weights
    return jnp.sum(loss), jnp.sum(correct), jnp.sum(weights)


def chunked_prediction_stats(name: str, head: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                             labels: jax.Array, weights: jax.Array, chunks: int) -> dict:
    """`prediction_stats` of head(hidden) [B, T, V], computed over `chunks` slices of the length axis in turn:
    each slice's logits are recomputed in the backward pass, so one slice's [B, T / chunks, V] is all that
    is ever live, where the whole logits (and their gradient) would be `chunks` times that."""
    batch, length = labels.shape
    if length % chunks:
        raise ValueError(f"model.logits_chunks={chunks} does not divide the sequence length {length}")

    def sliced(x: jax.Array) -> jax.Array:
        return jnp.moveaxis(x.reshape(batch, chunks, length // chunks, *x.shape[2:]), 1, 0)

    @jax.checkpoint
    def add_slice(totals, xs):
        sums = weighted_cross_entropy(head(xs[0]), xs[1], xs[2])
        return tuple(total + s for total, s in zip(totals, sums)), None

    zero = jnp.zeros((), jnp.float32)
    (loss, correct, count), _ = jax.lax.scan(add_slice, (zero, zero, zero),
                                             (sliced(hidden), sliced(labels), sliced(weights.astype(jnp.float32))))
    return {f"{name}_loss_sum": loss, f"{name}_correct": correct, f"{name}_count": count}


def ratio(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    return numerator / jnp.maximum(denominator, 1e-9)


def prediction_stats(name: str, logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None) -> dict:
    """`weighted_cross_entropy`'s sums as {name}_loss_sum, {name}_correct, {name}_count."""
    loss, correct, count = weighted_cross_entropy(logits, labels, weights)
    return {f"{name}_loss_sum": loss, f"{name}_correct": correct, f"{name}_count": count}


def prediction_summary(name: str, stats: dict) -> tuple[jax.Array, jax.Array]:
    """(mean loss, accuracy) of the `prediction_stats` called `name`."""
    count = stats[f"{name}_count"]
    return ratio(stats[f"{name}_loss_sum"], count), ratio(stats[f"{name}_correct"], count)
