"""Dropout whose masks cost a quarter of jax.random.bernoulli's random bits: keep_mask and the Dropout module."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

LEVELS = 1 << 16  # each draw compares 16 random bits with round(keep_prob · LEVELS)


def keep_threshold(keep_prob: float) -> int:
    """The 16-bit draws below which an element is kept."""
    return round(keep_prob * LEVELS)


def _threefry_words(rng: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """The two uint32 outputs of one threefry block per element of `shape`, whose counters are elementwise over
    the array, so that a sharded axis stays sharded (as jax.random.bits under jax_threefry_partitionable)."""
    counter = sum(jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(math.prod(shape[axis + 1:]))
                  for axis in range(len(shape)))
    high, low = jax.random.key_data(rng)
    return threefry2x32_p.bind(high, low, jnp.zeros(shape, jnp.uint32), counter)


def keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """(bool `shape`, each True with probability `kept`; `kept`): `kept` is keep_prob to 16 bits (0.9 →
    0.899994), the fraction inverted dropout divides by so that the mean stays exact. Each row's draws are
    16-bit halves, in order, of consecutive threefry blocks, four to a block (jax.random.bernoulli spends a
    block on each draw), or of another generator's 32-bit words, two to a word."""
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(rng)
    *lead, count = shape
    threshold = keep_threshold(keep_prob)
    blocks = -(-count // 4)
    if str(jax.random.key_impl(rng)) == "threefry2x32" and blocks * math.prod(lead) < 1 << 32:
        words = _threefry_words(rng, (*lead, blocks))
    else:
        words = (jax.random.bits(rng, (*lead, -(-count // 2)), jnp.uint32),)
    # compared before they are interleaved, so that the interleaved copy XLA writes holds booleans, not words
    halves = [half for word in words for half in (word & 0xFFFF < threshold, word >> 16 < threshold)]
    return jnp.stack(halves, axis=-1).reshape(*lead, -1)[..., :count], threshold / LEVELS


def dropout(x: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
    """Inverted dropout of `x` at `rate`, masks from keep_mask; zeros where 16 bits keep nothing (rate ≈ 1)."""
    if keep_threshold(1.0 - rate) == 0:
        return jnp.zeros_like(x)
    keep, kept = keep_mask(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / kept, jnp.zeros((), x.dtype))


class Dropout(nn.Module):
    """flax.linen.Dropout's contract (rate, `deterministic`, the "dropout" RNG stream) on keep_mask's masks."""
    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"))
