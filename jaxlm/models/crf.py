"""The linear-chain CRF (pytorch-crf's semantics): log-likelihood, Viterbi decoding, BIO constraints, its module."""
from __future__ import annotations

from typing import NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.parallel.logical import with_logical_partitioning

DISALLOWED = -1e4
SCHEMES = ("BIO", "IOB2")


class Allowed(NamedTuple):
    """Which transitions a tagging scheme permits: transitions[i, j] (tag i followed by tag j), start, end."""

    transitions: np.ndarray
    start: np.ndarray
    end: np.ndarray


def allowed_transitions(labels: Sequence[str], scheme: str = "BIO") -> Allowed:
    """BIO (IOB2) rules over `labels` ("O", "B-X", "I-X"): I-X only follows B-X or I-X, and never starts."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tagging scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    parts = []
    for label in labels:
        prefix, _, kind = label.partition("-")
        if not (label == "O" or (prefix in ("B", "I") and kind)):
            raise ValueError(f"label {label!r} is not BIO: use 'O', 'B-<type>' or 'I-<type>'")
        parts.append((prefix, kind))
    inside = np.array([prefix == "I" for prefix, _ in parts])
    kinds = np.array([kind for _, kind in parts])
    return Allowed(~inside[None, :] | (kinds[:, None] == kinds[None, :]), ~inside, np.ones(len(parts), bool))


def apply_constraints(transitions, start, end, allowed: Allowed):
    """The scores with every disallowed transition, start and end set to DISALLOWED."""
    return tuple(jnp.where(ok, score, DISALLOWED) for score, ok in zip((transitions, start, end), allowed))


def _check(emissions, mask, transitions):
    if emissions.ndim != 3 or emissions.shape[:2] != mask.shape or transitions.shape != (emissions.shape[2],) * 2:
        raise ValueError(f"expected emissions [B, T, K], mask [B, T] and transitions [K, K]; got "
                         f"{emissions.shape}, {mask.shape} and {transitions.shape}")
    if not isinstance(mask, jax.core.Tracer) and not np.asarray(mask)[:, 0].all():
        raise ValueError("mask of the first timestep must be on for every sequence (right padding)")


def _lattice(emissions, mask, transitions, start, reduce):
    """Scores [B, K] of the best (or all, per `reduce` over the previous tag) paths ending in each tag at
    each sequence's last real step, and `reduce`'s second output at every step after the first."""
    def step(score, inputs):
        emit, on = inputs
        new, aux = reduce(score[:, :, None] + transitions + emit[:, None, :])
        return jnp.where(on[:, None], new, score), aux
    return jax.lax.scan(step, start + emissions[:, 0], (jnp.swapaxes(emissions[:, 1:], 0, 1), mask[:, 1:].T))


def _inputs(emissions, mask, transitions, start, end):
    mask = jnp.asarray(mask).astype(bool)
    _check(emissions, mask, transitions)
    return (jnp.asarray(emissions, jnp.float32), mask,
            *(jnp.asarray(p, jnp.float32) for p in (transitions, start, end)))


def crf_log_likelihood(emissions, tags, mask, transitions, start, end) -> jax.Array:
    """log p(tags | emissions) [B] for emissions [B, T, K], tags [B, T], right-padded mask [B, T] (first step
    on), transitions [K, K] (tag i followed by tag j), start and end [K]; float32. pytorch-crf's forward with
    reduction='none'. Tags at padding positions are ignored."""
    emissions, mask, transitions, start, end = _inputs(emissions, mask, transitions, start, end)
    tags = jnp.where(mask, tags, 0)
    emitted = jnp.take_along_axis(emissions, tags[..., None], axis=-1)[..., 0]
    steps = jnp.where(mask[:, 1:], transitions[tags[:, :-1], tags[:, 1:]] + emitted[:, 1:], 0.0)
    last = jnp.take_along_axis(tags, mask.sum(1, keepdims=True) - 1, axis=1)[:, 0]
    score = start[tags[:, 0]] + emitted[:, 0] + steps.sum(1) + end[last]
    alpha, _ = _lattice(emissions, mask, transitions, start, lambda s: (jax.nn.logsumexp(s, axis=1), None))
    return score - jax.nn.logsumexp(alpha + end, axis=1)


def crf_decode(emissions, mask, transitions, start, end) -> tuple[jax.Array, jax.Array]:
    """Viterbi: the best tags [B, T] int32 (0 at padding positions) and their unnormalised scores [B];
    pytorch-crf's decode, batched. Arguments as crf_log_likelihood's."""
    emissions, mask, transitions, start, end = _inputs(emissions, mask, transitions, start, end)
    best, pointers = _lattice(emissions, mask, transitions, start, lambda s: (s.max(1), s.argmax(1)))
    # Identity pointers after a sequence's end carry its best last tag back to its last real step.
    pointers = jnp.where(mask[:, 1:].T[..., None], pointers, jnp.arange(emissions.shape[2]))
    final = best + end
    last = final.argmax(1)

    def back(tag, step_pointers):
        previous = jnp.take_along_axis(step_pointers, tag[:, None], axis=1)[:, 0]
        return previous, previous
    _, earlier = jax.lax.scan(back, last, pointers, reverse=True)
    tags = jnp.concatenate([earlier, last[None]]).T
    return jnp.where(mask, tags, 0).astype(jnp.int32), final.max(1)


def _uniform(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -0.1, 0.1)


class CRF(nn.Module):
    """Transition, start and end scores (uniform(-0.1, 0.1), as pytorch-crf) over `num_tags` tags; with
    `labels` (in tag order) the `scheme`'s disallowed transitions are scored DISALLOWED."""

    num_tags: int
    labels: tuple[str, ...] | None = None
    scheme: str = "BIO"

    def setup(self):
        if self.labels is not None and len(self.labels) != self.num_tags:
            raise ValueError(f"CRF has {self.num_tags} tags but {len(self.labels)} labels")
        self.transitions = self.param("transitions", with_logical_partitioning(_uniform, (None, "classes")),
                                      (self.num_tags, self.num_tags))
        self.start = self.param("start", with_logical_partitioning(_uniform, ("classes",)), (self.num_tags,))
        self.end = self.param("end", with_logical_partitioning(_uniform, ("classes",)), (self.num_tags,))

    def _scores(self):
        scores = (self.transitions, self.start, self.end)
        if self.labels is None:
            return scores
        return apply_constraints(*scores, allowed_transitions(self.labels, self.scheme))

    def log_likelihood(self, emissions, tags, mask) -> jax.Array:
        return crf_log_likelihood(emissions, tags, mask, *self._scores())

    def decode(self, emissions, mask) -> tuple[jax.Array, jax.Array]:
        return crf_decode(emissions, mask, *self._scores())
