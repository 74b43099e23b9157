"""Cross-entropy in float32 with weights, returning sums so callers can aggregate exactly."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxlm.parallel.logical import target_platform


LOSS_SCOPE = "cross_entropy"  # the ops under it are what `jaxlm bench --profile` counts as the loss


def _merge_partial_softmaxes(a, b):
    """Two partial (largest logit, sum of exp(logit - largest), first index of the largest) as one: associative,
    with (-inf, 0, any) as its identity, so that XLA may reduce a row in any order and split."""
    (top_a, total_a, at_a), (top_b, total_b, at_b) = a, b
    # exp of minus the gap scales the smaller partial's sum: one exp per merge, and none of -inf - -inf
    scale = jnp.exp(jnp.where(top_a == top_b, 0.0, -jnp.abs(top_a - top_b)))
    total = jnp.where(top_a >= top_b, total_a + total_b * scale, total_a * scale + total_b)
    at = jnp.where(top_a > top_b, at_a, jnp.where(top_b > top_a, at_b, jnp.minimum(at_a, at_b)))
    return jnp.maximum(top_a, top_b), total, at


def softmax_statistics(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log-sum-exp, argmax) over the last axis of float32 `logits` in one read of them: a reduce over running
    (largest, sum of exp below it, index) triples, where logsumexp and argmax read the logits twice apart (the
    sum after the largest) and a third time for the argmax, each a full pass over GPT-2's [tokens, 50k]."""
    axis = logits.ndim - 1
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, axis)
    start = (jnp.array(-jnp.inf, jnp.float32), jnp.array(0.0, jnp.float32), jnp.array(jnp.iinfo(jnp.int32).max))
    top, total, at = jax.lax.reduce((logits, jnp.ones_like(logits), index), start, _merge_partial_softmaxes, (axis,))
    return top + jnp.log(total), at


def _weighted_sums(per_token: jax.Array, correct: jax.Array, weights: jax.Array) -> tuple:
    """(loss sum, correct-prediction sum, weight sum) of per-token losses and correct (boolean) predictions."""
    return jnp.sum(per_token * weights), jnp.sum(correct.astype(jnp.float32) * weights), jnp.sum(weights)


def _is_label(logits: jax.Array, labels: jax.Array) -> jax.Array:
    vocabulary = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return vocabulary == labels[..., None]


def _sums_and_residuals(logits, labels, weights):
    """The sums and what the gradient needs of them, the logits read once (the label's logit gathered)."""
    log_z, best = softmax_statistics(logits)
    vocabulary = logits.shape[-1]
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1, mode="clip")
    # a label outside the vocabulary (an ignored position's -1 or -100) picks nothing, as `_is_label` finds none
    label_logit = jnp.where((labels >= 0) & (labels < vocabulary), picked[..., 0], 0.0)
    per_token = log_z - label_logit
    return _weighted_sums(per_token, best == labels, weights), (logits, labels, weights, log_z, per_token)


@jax.custom_vjp
def _cross_entropy_sums(logits, labels, weights):
    """(loss sum, correct-prediction sum, weight sum) of float32 logits, int32 labels and float32 weights."""
    return _sums_and_residuals(logits, labels, weights)[0]


def _cross_entropy_gradient(residuals, cotangents):
    """The logits' gradient from one more read of them (softmax minus the label's indicator, elementwise, which
    XLA fuses with its consumer) and the weights'; the correct-prediction count is flat, without a gradient."""
    logits, labels, weights, log_z, per_token = residuals
    loss_cotangent, _, count_cotangent = cotangents
    softmax_minus_label = jnp.exp(logits - log_z[..., None]) - _is_label(logits, labels)
    return ((loss_cotangent * weights)[..., None] * softmax_minus_label, None,
            loss_cotangent * per_token + count_cotangent)


_cross_entropy_sums.defvjp(_sums_and_residuals, _cross_entropy_gradient)


def _two_pass_sums(logits, labels, weights):
    """`_cross_entropy_sums` as written: logsumexp, the label's logit by comparison (its gradient an elementwise
    select that fuses into the softmax's) and argmax, differentiated by JAX. XLA's CPU backend runs these reductions
    in about half the time of `softmax_statistics`'s merges (a [2048, 30522] step: 0.23 against 0.41 s)."""
    log_z = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.sum(jnp.where(_is_label(logits, labels), logits, 0.0), axis=-1)
    return _weighted_sums(log_z - label_logit, jnp.argmax(logits, axis=-1) == labels, weights)


@jax.named_scope(LOSS_SCOPE)
def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None):
    """(loss sum, correct-prediction sum, weight sum) of softmax cross-entropy over the last axis.

    Built for a GPU, the forward pass reads the logits once (`softmax_statistics`) and the backward pass once more
    (`_cross_entropy_sums`); elsewhere logsumexp, the label's logit and argmax read them apart (`_two_pass_sums`)."""
    weights = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
    sums = _cross_entropy_sums if target_platform() == "gpu" else _two_pass_sums
    return sums(logits.astype(jnp.float32), labels.astype(jnp.int32), weights)


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
