"""Dropout whose masks cost a quarter of jax.random.bernoulli's random bits: keep_mask and the Dropout module."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

LEVELS = 1 << 16  # each draw compares 16 random bits with round(keep_prob · LEVELS)


def _uniform_halves(rng: jax.Array, lead: tuple[int, ...], count: int) -> jax.Array:
    """uint16 [*lead, count] of random bits: four from each threefry block (jax.random.bits XORs a block's two
    32-bit outputs into one word), two from each word of another generator. Each row's draws come in order
    from consecutive blocks, whose counters are elementwise over the array, so a sharded axis stays sharded
    (as jax.random.bits under jax_threefry_partitionable)."""
    blocks = -(-count // 4)
    if str(jax.random.key_impl(rng)) != "threefry2x32" or blocks * math.prod(lead) >= 1 << 32:
        words = jax.random.bits(rng, (*lead, -(-count // 2)), jnp.uint32)
    else:
        shape = (*lead, blocks)
        counter = sum(jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(math.prod(shape[axis + 1:]))
                      for axis in range(len(shape)))
        high, low = jax.random.key_data(rng)
        words = jnp.stack(threefry2x32_p.bind(high, low, jnp.zeros(shape, jnp.uint32), counter), axis=-1)
    return jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(*lead, -1)[..., :count]


def _threshold(keep_prob: float) -> int:
    """The 16-bit draws below which an element is kept."""
    return round(keep_prob * LEVELS)


def keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """(bool `shape`, each True with probability `kept`; `kept`): `kept` is keep_prob to 16 bits (0.9 →
    0.899994), the fraction inverted dropout divides by so that the mean stays exact. jax.random.bernoulli
    spends a threefry block on each draw; this, a quarter of one."""
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(rng)
    *lead, last = shape
    threshold = _threshold(keep_prob)
    return _uniform_halves(rng, tuple(lead), last) < threshold, threshold / LEVELS


def dropout(x: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
    """Inverted dropout of `x` at `rate`, masks from keep_mask; zeros where 16 bits keep nothing (rate ≈ 1)."""
    if _threshold(1.0 - rate) == 0:
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
