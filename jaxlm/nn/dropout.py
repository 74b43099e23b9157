"""Dropout whose masks cost a quarter of jax.random.bernoulli's random bits (keep_mask), or none (hashed
masks), and the Dropout module."""
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import define_prng_impl, threefry2x32_p, threefry_prng_impl

LEVELS = 1 << 16  # each draw compares 16 random bits with round(keep_prob · LEVELS)
# train.dropout_rng=hash: threefry's keys under a name of their own, whose masks are hashed from each element's
# index (hashed_keep) inside the kernels that apply them, in the forward pass and again in the backward pass.
# Threefry's are drawn in kernels of their own and kept in memory, a byte an element, between the two passes.
# Under jit's sharding each device hashes the global indices of its shard; inside a shard_map of the caller's,
# the local ones (as threefry's draws there).
HASHED = define_prng_impl(key_shape=threefry_prng_impl.key_shape, seed=threefry_prng_impl.seed,
                          split=threefry_prng_impl.split, random_bits=threefry_prng_impl.random_bits,
                          fold_in=threefry_prng_impl.fold_in, name="hashed", tag="hashed")
_GOLDEN = np.uint32(0x9E3779B9)


def keep_threshold(keep_prob: float) -> int:
    """The 16-bit draws below which an element is kept."""
    return round(keep_prob * LEVELS)


def kept_fraction(rate: float) -> float:
    """The fraction of elements a dropout at `rate` keeps, and divides the kept ones by: 1 - rate to 16 bits."""
    return keep_threshold(1.0 - rate) / LEVELS


def _threefry_words(rng: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """The two uint32 outputs of one threefry block per element of `shape`, whose counters are elementwise over
    the array, so that a sharded axis stays sharded (as jax.random.bits under jax_threefry_partitionable)."""
    counter = _flat_index(shape, 0, len(shape))
    high, low = jax.random.key_data(rng)
    return threefry2x32_p.bind(high, low, jnp.zeros(shape, jnp.uint32), counter)


def mix(x: jax.Array) -> jax.Array:
    """lowbias32 (Wellons's 32-bit integer hash): each output bit flips with about half of the input's bits."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x21F0AAAD)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x735A2D97)
    return x ^ (x >> 15)


def seed_words(rng: jax.Array) -> jax.Array:
    """A dropout key's two uint32 words."""
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    return rng.reshape(-1)[-2:].astype(jnp.uint32)


def hashed_bits(seed: jax.Array, row: jax.Array, position: jax.Array) -> jax.Array:
    """32 bits hashed from the two seed words, a row and a position in it: two rounds of `mix`."""
    return mix(mix(position ^ seed[0]) ^ (row * _GOLDEN + seed[1]))


def hashed_keep(seed: jax.Array, threshold: int, shape: tuple[int, ...]) -> jax.Array:
    """Booleans of `shape`: 16 bits hashed from each element's index below `threshold`. The row is the index
    over all axes but the last two, the position the index over those two: for attention weights [batch,
    heads, queries, keys] whose key length is a multiple of the flash kernels' block (jaxlm.nn.flash hashes
    the padded length), the flash kernels' masks."""
    split = max(len(shape) - 2, 0)
    if math.prod(shape[split:]) >= 1 << 32 or math.prod(shape[:split]) >= 1 << 32:
        raise ValueError(f"hashed dropout numbers rows and positions in 32 bits; {shape} has more")
    bits = hashed_bits(seed, _flat_index(shape, 0, split), _flat_index(shape, split, len(shape)))
    return (bits >> 16) < np.uint32(threshold)


def _flat_index(shape: tuple[int, ...], start: int, stop: int) -> jax.Array:
    """uint32 `shape`: each element's row-major index over axes start..stop-1 (0 where there are none). Built
    from iotas, elementwise over the array, so that a sharded axis stays sharded."""
    index = jnp.zeros(shape, jnp.uint32)
    for axis in range(start, stop):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(math.prod(shape[axis + 1:stop]))
    return index


def keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """(bool `shape`, each True with probability `kept`; `kept`): `kept` is keep_prob to 16 bits (0.9 →
    0.899994), the fraction inverted dropout divides by so that the mean stays exact. Each row's draws are
    16-bit halves, in order, of consecutive threefry blocks, four to a block (jax.random.bernoulli spends a
    block on each draw), or of another generator's 32-bit words, two to a word; a HASHED key's are hashed_keep's."""
    if is_hashed(rng):
        threshold = keep_threshold(keep_prob)
        return hashed_keep(seed_words(rng), threshold, shape), threshold / LEVELS
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
    """Inverted dropout of `x` at `rate`, masks from keep_mask (a HASHED key's: hashed_keep, computed again
    in the backward pass rather than kept); zeros where 16 bits keep nothing (rate ≈ 1)."""
    threshold = keep_threshold(1.0 - rate)
    if threshold == 0:
        return jnp.zeros_like(x)
    if is_hashed(rng):
        return _hashed_dropout(x, seed_words(rng), threshold)
    keep, kept = keep_mask(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / kept, jnp.zeros((), x.dtype))


def is_hashed(rng: jax.Array) -> bool:
    """Whether `rng` is a HASHED key (train.dropout_rng=hash)."""
    return jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) and jax.random.key_impl(rng) == HASHED


def _dropped(x: jax.Array, seed: jax.Array, threshold: int) -> jax.Array:
    return jnp.where(hashed_keep(seed, threshold, x.shape), x / (threshold / LEVELS), jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _hashed_dropout(x: jax.Array, seed: jax.Array, threshold: int) -> jax.Array:
    return _dropped(x, seed, threshold)


def _hashed_dropout_forward(x, seed, threshold):
    return _dropped(x, seed, threshold), seed


def _hashed_dropout_backward(threshold, seed, grad):
    return _dropped(grad, seed, threshold), np.zeros(seed.shape, jax.dtypes.float0)


_hashed_dropout.defvjp(_hashed_dropout_forward, _hashed_dropout_backward)


class Dropout(nn.Module):
    """flax.linen.Dropout's contract (rate, `deterministic`, the "dropout" RNG stream) on keep_mask's masks."""
    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"))
